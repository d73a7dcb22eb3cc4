"""Pallas kernels XLA does not write (run by Pallas's interpreter on a CPU): the output
projection fused with its loss, for GPUs (`vocabulary_loss`, Triton) and TPUs
(`vocabulary_loss_tpu`, Mosaic), what both compute on a tile (`logit_tiles`), and the
residual connection, dropout and layer norm in one pass for GPUs (`layer_norm`), and
the feed-forward layer's ReLU gradient inside its product for GPUs (`relu_product`)."""

from __future__ import annotations


def products() -> dict[str, int]:
  """Each kernel's products of its first two operands, [rows, d] by [n, d] (2 rows n d
  FLOPs each), by its pallas_call name: what benchmarks/roofline.py counts for it."""
  from transformer_jax.kernels import layer_norm, logit_tiles, relu_product
  return {**logit_tiles.PRODUCTS, **layer_norm.PRODUCTS, **relu_product.PRODUCTS}
