from minilm_jax.models.encoder import Encoder, EncoderConfig, EncoderOutput, LayerOutput

__all__ = ["Encoder", "EncoderConfig", "EncoderOutput", "LayerOutput"]
