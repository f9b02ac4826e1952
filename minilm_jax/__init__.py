"""minilm_jax: knowledge distillation of Transformer encoders in JAX/Flax."""

__version__ = "0.1.0"
