"""What computes, and its formats: the encoder (`encoder`, its attention paths in `attention`, its
architecture in `config`; what MPNet, DeBERTa and ModernBERT change of BERT's layers in `mpnet`,
`deberta` and `modernbert`), its parameter layout (`layout`) and
sharding rules (`sharding`), task heads (`heads`), beam search
(`generation`), the thesis's students (`lstm`, `students`), Hugging Face conversion (`hf`),
sentence-transformers' embeddings (`embeddings`), and analytic FLOPs (`flops`)."""

from minilm_jax.models.encoder import Encoder, EncoderConfig, EncoderOutput, LayerOutput

__all__ = ["Encoder", "EncoderConfig", "EncoderOutput", "LayerOutput"]
