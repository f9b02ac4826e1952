"""What computes, and its formats: the encoder (`encoder`, its architecture in `config`; what MPNet
and DeBERTa add to BERT's layers in `mpnet` and `deberta`), its parameter layout (`layout`) and
sharding rules (`sharding`), task heads (`heads`), beam search
(`generation`), the thesis's students (`lstm`, `students`), Hugging Face conversion (`hf`),
sentence-transformers' embeddings (`embeddings`), and analytic FLOPs (`flops`)."""

from minilm_jax.models.encoder import Encoder, EncoderConfig, EncoderOutput, LayerOutput

__all__ = ["Encoder", "EncoderConfig", "EncoderOutput", "LayerOutput"]
