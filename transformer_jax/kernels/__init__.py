"""Pallas kernels XLA does not write, for GPUs (Triton backend; run by Pallas's
interpreter on a CPU): the output projection fused with its loss (`vocabulary_loss`),
and the residual connection, dropout and layer norm in one pass (`layer_norm`)."""

from __future__ import annotations


def products() -> dict[str, int]:
  """Each kernel's products of its first two operands, [rows, d] by [n, d] (2 rows n d
  FLOPs each), by its pallas_call name: what benchmarks/roofline.py counts for it."""
  from transformer_jax.kernels import layer_norm, vocabulary_loss
  return {**vocabulary_loss.PRODUCTS, **layer_norm.PRODUCTS}
