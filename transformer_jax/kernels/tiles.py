"""What the kernels compute on a tile: the vocabulary loss's logit gradient, the same for
the GPU's (vocabulary_loss.py) and the TPU's (vocabulary_loss_tpu.py); the GPU kernels'
product of two row tiles (vocabulary_loss.py, ffn.py); operands padded to whole tiles."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

def logit_gradient(z, cols, targets, lse, g_lse, g_target):
  """d(g_lse . lse + g_target . z_t)/dz of a tile of logits z [rows, vocab], the other
  operands [rows, 1] columns: g_lse softmax(z) + g_target one_hot(t). Padded columns
  need no mask here: their rows of w are zeros, so they add nothing to h's gradient,
  and their rows of w's gradient are dropped."""
  return g_lse * jnp.exp(z - lse) + jnp.where(cols == targets, g_target, 0.0)


def product_precision(dtype) -> jax.lax.Precision | None:
  """float32 products in float32 (not TF32), as XLA computes the logits."""
  return jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else None


def tile_product(a_ref, b_ref, a_start, b_start, rows, cols, depth_tile, precision):
  """a[rows] @ b[cols].T from two refs of rows of d, [rows, cols] float32, summed over d
  `depth_tile` at a time (a loop: only one slice of each is in shared memory at once)."""
  depth_tile = min(depth_tile, a_ref.shape[1])

  def step(k, acc):
    a = a_ref[pl.ds(a_start, rows), pl.ds(k * depth_tile, depth_tile)]
    b = b_ref[pl.ds(b_start, cols), pl.ds(k * depth_tile, depth_tile)]
    return acc + jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), precision=precision,
                                     preferred_element_type=jnp.float32)

  return jax.lax.fori_loop(0, a_ref.shape[1] // depth_tile, step,
                           jnp.zeros((rows, cols), jnp.float32))


def padded(x: jax.Array, rows: int, width: int) -> jax.Array:
  """[n, d] padded with zeros to a multiple of `rows` rows and to `width` columns:
  whole tiles."""
  return jnp.pad(x, ((0, -x.shape[0] % rows), (0, width - x.shape[1])))
