"""The paper's residual connection, LayerNorm(x + Dropout(sublayer(x))) (Sec. 3.1, 5.4),
in one Pallas kernel each way for GPUs.

XLA writes this as several passes over [tokens, d_model] arrays: the dropout's random
bits (with train.rng_impl=rbg, written to memory and read back), its mask, the sum, the
statistics, the normalized output, and as many again for the gradient. Here the
forward reads x and the sublayer's output s once and writes y once, and the backward
reads dy, x and s once and writes dx and ds once (plus per-row statistics, and the
scale's and bias's gradients summed per tile). The dropout bits are computed inside
both kernels from a 64-bit key and each element's index, by Threefry-2x32 (JAX's
default generator's function, 20 rounds): the backward regenerates the forward's mask
instead of reading it. Masks are independent across calls (each draws its key from the
module's dropout RNG) and across elements; keep probability 1 - rate, kept values
scaled by 1 / (1 - rate), as nn.Dropout. Same backend as vocabulary_loss (Triton; its
docstring says why).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from transformer_jax.kernels import placement
from transformer_jax.kernels.tiles import padded

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def threefry2x32(k0, k1, x0, x1):
  """Threefry-2x32 (Salmon et al. 2011; jax.random's), element-wise on uint32 arrays:
  the two words encrypting (x0, x1) under the key (k0, k1)."""
  rotate = lambda v, d: (v << jnp.uint32(d)) | (v >> jnp.uint32(32 - d))
  keys = (k0, k1, k0 ^ k1 ^ jnp.uint32(0x1BD11BDA))
  x0, x1 = x0 + keys[0], x1 + keys[1]
  for i in range(5):
    for r in _ROTATIONS[i % 2]:
      x0 = x0 + x1
      x1 = rotate(x1, r) ^ x0
    x0, x1 = x0 + keys[(i + 1) % 3], x1 + keys[(i + 2) % 3] + jnp.uint32(i + 1)
  return x0, x1


def keep_mask(key, index, rate: float):
  """Which elements dropout keeps: Threefry's first word of (index, 0) under `key` (two
  uint32) below (1 - rate) 2^32."""
  bits, _ = threefry2x32(key[0], key[1], index, jnp.zeros_like(index))
  return bits < jnp.uint32(min(round((1.0 - rate) * 2.0**32), 2**32 - 1))


def residual_norm(x: jax.Array, s: jax.Array, scale: jax.Array, bias: jax.Array,
                  key: jax.Array, *, rate: float, epsilon: float, first_row=0,
                  interpret: bool | None = None) -> jax.Array:
  """LayerNorm(x + Dropout(s)) over the last axis, in x's dtype.

  Args:
    x, s: [..., d] the residual stream and the sublayer's output (one dtype).
    scale, bias: [d] LayerNorm's parameters (float32).
    key: [2] uint32, the dropout's key (ignored when rate is 0).
    rate: the dropout rate; 0: none.
    epsilon: LayerNorm's.
    first_row: the index of x's first row among all rows (of every device's shard):
      an element's bits depend on its place in the whole array, not in a shard.
    interpret: Pallas's interpreter; None: on a CPU (placement.interpret).
  """
  interpret = placement.interpret() if interpret is None else interpret
  shape = x.shape
  key = jnp.concatenate([key.astype(jnp.uint32), jnp.asarray(first_row, jnp.uint32)[None]])
  y = _residual_norm(x.reshape(-1, shape[-1]), s.reshape(-1, shape[-1]), scale, bias, key,
                     rate, epsilon, interpret)
  return y.reshape(shape)


def reference(x, s, scale, bias, keep, *, rate: float, epsilon: float, dtype) -> jax.Array:
  """XLA's path in `dtype` with a given keep mask, LayerNorm(x + Dropout(s)): what the
  kernels are checked against (tests, benchmarks.kernel_check)."""
  x, s = x.astype(dtype), s.astype(dtype)
  z = x + jnp.where(keep, s / (1 - rate), 0).astype(dtype)
  mean = z.mean(-1, keepdims=True)
  var = ((z - mean) ** 2).mean(-1, keepdims=True)
  return ((z - mean) * jax.lax.rsqrt(var + epsilon) * scale + bias).astype(dtype)


def _rows(d: int) -> int:
  """Rows a program owns: about 4,096 elements (powers of two)."""
  return max(1, 4096 // pl.next_power_of_2(d))


def _tile(ref, row_start, rows, width, d, first_row):
  """A program's block of a [tokens, width] operand (its rows from row_start on),
  float32, with its real columns' mask and each element's index in the whole unpadded
  [all rows, d] array."""
  value = ref[...].astype(jnp.float32)
  row = row_start + jax.lax.broadcasted_iota(jnp.int32, (rows, width), 0)
  col = jax.lax.broadcasted_iota(jnp.int32, (rows, width), 1)
  return value, col < d, (row.astype(jnp.uint32) + first_row) * jnp.uint32(d) + \
      col.astype(jnp.uint32)


def _normalized(x_ref, s_ref, key_ref, start, rows, *, d, rate, epsilon):
  """z = x + dropout(s), its normalized form, 1 / std, and the keep mask of a tile."""
  width = x_ref.shape[1]
  x, real, index = _tile(x_ref, start, rows, width, d, key_ref[2])
  s = s_ref[...].astype(jnp.float32)
  keep = real
  if rate:
    keep = keep & keep_mask((key_ref[0], key_ref[1]), index, rate)
    s = s / (1.0 - rate)
  z = jnp.where(real, x, 0.0) + jnp.where(keep, s, 0.0)
  mean = jnp.sum(z, axis=1) / d
  centered = jnp.where(real, z - mean[:, None], 0.0)
  rstd = jax.lax.rsqrt(jnp.sum(centered * centered, axis=1) / d + epsilon)
  return centered * rstd[:, None], rstd, keep, real


def _forward_kernel(x_ref, s_ref, scale_ref, bias_ref, key_ref, y_ref, *, d, rate,
                    epsilon):
  rows = y_ref.shape[0]
  start = pl.program_id(0) * rows
  zhat, _, _, _ = _normalized(x_ref, s_ref, key_ref, start, rows, d=d, rate=rate,
                              epsilon=epsilon)
  y_ref[...] = (zhat * scale_ref[...][None, :] + bias_ref[...][None, :]).astype(y_ref.dtype)


def _backward_kernel(x_ref, s_ref, scale_ref, key_ref, dy_ref, dx_ref, ds_ref,
                     dscale_ref, dbias_ref, *, d, rate, epsilon):
  rows = dx_ref.shape[0]
  start = pl.program_id(0) * rows
  zhat, rstd, keep, real = _normalized(x_ref, s_ref, key_ref, start, rows, d=d, rate=rate,
                                       epsilon=epsilon)
  dy = jnp.where(real, dy_ref[...].astype(jnp.float32), 0.0)
  g = dy * scale_ref[...][None, :]
  # d/dz of LayerNorm: rstd (g - mean(g) - zhat mean(g zhat)).
  dz = rstd[:, None] * (g - (jnp.sum(g, axis=1) / d)[:, None]
                        - zhat * (jnp.sum(g * zhat, axis=1) / d)[:, None])
  dx_ref[...] = dz.astype(dx_ref.dtype)
  ds_ref[...] = jnp.where(keep, dz / (1.0 - rate), 0.0).astype(ds_ref.dtype)
  dscale_ref[...] = jnp.sum(dy * zhat, axis=0)[None, :]
  dbias_ref[...] = jnp.sum(dy, axis=0)[None, :]


def _calls(x, s, kernel, rate, epsilon, interpret):
  """x and s padded to whole tiles of rows, d to a power of two; a [d] vector padded so;
  and `kernel` as a pallas_call over the row tiles."""
  d = x.shape[1]
  width, rows = pl.next_power_of_2(d), _rows(d)
  xp, sp = padded(x, rows, width), padded(s, rows, width)
  vector = lambda v: jnp.pad(v.astype(jnp.float32), (0, width - d))
  call = functools.partial(
      pl.pallas_call, functools.partial(kernel, d=d, rate=rate, epsilon=epsilon),
      grid=(xp.shape[0] // rows,),
      compiler_params=placement.triton_params(interpret, num_warps=4),
      interpret=interpret)
  return xp, sp, vector, call


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _residual_norm(x, s, scale, bias, key, rate, epsilon, interpret):
  return _forward(x, s, scale, bias, key, rate, epsilon, interpret)[0]


def _tile_spec(xp, rows):
  return pl.BlockSpec((rows, xp.shape[1]), lambda i: (i, 0))


def _whole(shape):
  return pl.BlockSpec(shape, lambda i: (0,) * len(shape))


def _forward(x, s, scale, bias, key, rate, epsilon, interpret):
  xp, sp, vector, call = _calls(x, s, _forward_kernel, rate, epsilon, interpret)
  tile, width = _tile_spec(xp, _rows(x.shape[1])), xp.shape[1]
  y = call(out_shape=jax.ShapeDtypeStruct(xp.shape, x.dtype),
           in_specs=[tile, tile, _whole((width,)), _whole((width,)), _whole((3,))],
           out_specs=tile, name="residual_norm_forward")(xp, sp, vector(scale),
                                                          vector(bias), key)
  return y[:x.shape[0], :x.shape[1]], (x, s, scale, bias, key)


def _backward(rate, epsilon, interpret, residuals, dy):
  x, s, scale, bias, key = residuals
  xp, sp, vector, call = _calls(x, s, _backward_kernel, rate, epsilon, interpret)
  rows, width = _rows(x.shape[1]), xp.shape[1]
  tile, one_row = _tile_spec(xp, rows), pl.BlockSpec((1, width), lambda i: (i, 0))
  partial = jax.ShapeDtypeStruct((xp.shape[0] // rows, width), jnp.float32)  # A row a tile.
  dx, ds, dscale, dbias = call(
      out_shape=(jax.ShapeDtypeStruct(xp.shape, x.dtype),
                 jax.ShapeDtypeStruct(sp.shape, s.dtype), partial, partial),
      in_specs=[tile, tile, _whole((width,)), _whole((3,)), tile],
      out_specs=[tile, tile, one_row, one_row],
      name="residual_norm_backward")(xp, sp, vector(scale), key,
                                     padded(dy, rows, width))
  tokens, d = x.shape
  return (dx[:tokens, :d], ds[:tokens, :d], jnp.sum(dscale, axis=0)[:d].astype(scale.dtype),
          jnp.sum(dbias, axis=0)[:d].astype(bias.dtype), None)


_residual_norm.defvjp(_forward, _backward)
