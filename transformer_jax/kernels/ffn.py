"""The feed-forward layer's ReLU and second product, max(0, z + b1) W2 (Sec. 3.3), with
a backward pass whose gradient in z is one Pallas kernel (Triton) for GPUs.

XLA computes that gradient as a product, dy W2^T, written to memory as a [tokens, d_ff]
array, then a second pass that reads it back beside the ReLU's output and zeroes it
where the ReLU was: three [tokens, d_ff] arrays moved for one. cuBLAS has that epilogue
(CUBLASLT_EPILOGUE_DRELU_BGRAD) but XLA does not use it. Here each program computes a
[rows, cols] tile of dy W2^T over d in `depth` slices (float32 accumulators), zeroes it
where the ReLU's output h is not positive, writes it once in the compute dtype, and adds
its column sums to the bias's gradient (one row a tile of rows, summed by XLA: no
atomics, the same bits every run). The forward pass is XLA's: the bias and the max fuse
into the first product's epilogue (cuBLAS's BIAS_RELU), and h is kept for the backward,
as model/transformer.py's relu_from_output keeps it.

ReLU's derivative at 0 is 0, as jax.nn.relu's. The same backend choice as
vocabulary_loss.py (Triton: every GPU, both JAX versions, interpretable on the CPU).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from transformer_jax.kernels import placement
from transformer_jax.kernels.tiles import padded, product_precision, tile_product



@dataclasses.dataclass(frozen=True)
class Tiles:
  """A program's tile of the [tokens, d_ff] gradient, and the slice of d one product
  step reads (powers of two)."""
  rows: int = 128
  cols: int = 128
  depth: int = 64
  num_warps: int = 4
  num_stages: int = 2


def ffn_relu_product(z: jax.Array, bias: jax.Array, w: jax.Array, *,
                 interpret: bool | None = None, tiles: Tiles = Tiles()) -> jax.Array:
  """max(0, z + bias) @ w in z's dtype, for z [..., d_ff], bias [d_ff], w [d_ff, d];
  differentiable in all three. interpret: Pallas's interpreter; None: on a CPU."""
  interpret = placement.interpret() if interpret is None else interpret
  return _ffn_relu_product(z, bias, w, interpret, tiles)


def _product(h, w):
  return jax.lax.dot_general(h, w, (((h.ndim - 1,), (0,)), ((), ())))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _ffn_relu_product(z, bias, w, interpret, tiles):
  return _forward(z, bias, w, interpret, tiles)[0]


def _forward(z, bias, w, interpret, tiles):
  h = jnp.maximum(z + bias.astype(z.dtype), 0)
  return _product(h, w.astype(z.dtype)), (h, w, bias)


def _kernel(dy_ref, w_ref, h_ref, dz_ref, dbias_ref, *, tiles, precision):
  acc = tile_product(dy_ref, w_ref, 0, 0, tiles.rows, tiles.cols, tiles.depth, precision)
  dz = jnp.where(h_ref[...] > 0, acc, 0.0)
  dz_ref[...] = dz.astype(dz_ref.dtype)
  dbias_ref[...] = jnp.sum(dz, axis=0)[None, :]


def _backward(interpret, tiles, residuals, dy):
  h, w, bias = residuals
  d_ff, d = w.shape
  h2, dy2 = h.reshape(-1, d_ff), dy.reshape(-1, d).astype(h.dtype)
  depth = max(pl.next_power_of_2(d), 16)
  hp = padded(h2, tiles.rows, pl.cdiv(d_ff, tiles.cols) * tiles.cols)
  dyp = padded(dy2, tiles.rows, depth)
  wp = padded(w.astype(h.dtype), tiles.cols, depth)
  grid = (hp.shape[0] // tiles.rows, hp.shape[1] // tiles.cols)
  tile = pl.BlockSpec((tiles.rows, tiles.cols), lambda i, j: (i, j))
  dz, dbias = pl.pallas_call(
      functools.partial(_kernel, tiles=tiles, precision=product_precision(h.dtype)),
      out_shape=(jax.ShapeDtypeStruct(hp.shape, h.dtype),
                 jax.ShapeDtypeStruct((grid[0], hp.shape[1]), jnp.float32)),
      grid=grid,
      in_specs=[pl.BlockSpec((tiles.rows, depth), lambda i, j: (i, 0)),
                pl.BlockSpec((tiles.cols, depth), lambda i, j: (j, 0)), tile],
      out_specs=[tile, pl.BlockSpec((1, tiles.cols), lambda i, j: (i, j))],
      compiler_params=placement.triton_params(interpret, num_warps=tiles.num_warps,
                                                num_stages=tiles.num_stages),
      interpret=interpret, name="ffn_relu_product_grad")(dyp, wp, hp)
  dz = dz[:h2.shape[0], :d_ff].reshape(h.shape)
  dw = jax.lax.dot_general(h2, dy2, (((0,), (0,)), ((), ())),
                           preferred_element_type=jnp.float32)
  return dz, jnp.sum(dbias, axis=0)[:d_ff].astype(bias.dtype), dw.astype(w.dtype)


_ffn_relu_product.defvjp(_forward, _backward)
