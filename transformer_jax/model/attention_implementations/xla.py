"""XLA's attention (model.attention_implementation "xla", the default ""): JAX's
dot_product_attention with a dense boolean mask, on every platform and dtype."""

from __future__ import annotations

import jax

from transformer_jax.config import ATTENTION
from transformer_jax.model.attention import Implementation


@ATTENTION.register("xla")
class Xla(Implementation):
  """jax.nn.dot_product_attention with a dense boolean mask, by XLA."""

  def attend(self, q, k, v, mask):
    if mask is None:
      return jax.nn.dot_product_attention(q, k, v, implementation="xla")
    return jax.nn.dot_product_attention(q, k, v, mask=mask.dense(), implementation="xla")
