"""python -m transformer_jax.config: writes docs/config.md's text to stdout."""

from transformer_jax.config import field_reference

print(field_reference(), end="")
