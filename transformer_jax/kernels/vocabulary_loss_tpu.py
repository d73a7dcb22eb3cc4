"""The fused vocabulary loss's kernels for TPUs (Pallas's Mosaic TPU backend): the same
three kernels and the same arithmetic as kernels/vocabulary_loss.py's for GPUs, laid
out as a TPU wants them.

A GPU kernel there walks the vocabulary in a loop inside each program, with the whole
embedding in its block. A TPU core's fast memory (VMEM, 16 to 128 MiB) cannot hold a
37,000 x 512 embedding, so here the walk is the grid's last axis ("arbitrary":
sequential on one core), and Pallas streams one tile of h and one of w into VMEM per
step while the running statistics or the gradient's accumulator stay in VMEM scratch:

- forward, grid (row tiles, vocabulary tiles): the running maximum, sum of
  exponentials and target logit of each row, written at the last vocabulary tile;
- h's gradient, grid (row tiles, vocabulary tiles): a [rows, d] float32 accumulator;
- w's gradient, grid (vocabulary tiles, row tiles): a [vocabulary, d] accumulator.

Per-row vectors are [tokens, 1] columns (a TPU block's last dimension is a multiple of
128 or the whole dimension). Tiles are multiples of 128 (the matrix unit's side) and
d is padded to one.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from transformer_jax.kernels import placement
from transformer_jax import kernels
from transformer_jax.kernels.tiles import logit_gradient, padded, product_precision

LANES = 128  # A TPU vector register's lanes, and the matrix unit's side.


@dataclasses.dataclass(frozen=True)
class Tiles:
  rows: int = 256  # Tokens per tile (a multiple of 8).
  vocab: int = 512  # Vocabulary columns per tile (a multiple of 128).


def statistics(h, w, targets, vocab_size: int, interpret, tiles: Tiles):
  """As vocabulary_loss.statistics (which calls this for TPUs): (largest logit,
  log-sum-exp, target's logit) of each row, float32 [tokens]."""
  return _statistics(h, w, targets, vocab_size, interpret, tiles)


def _logits(h_ref, w_ref, precision):
  """This step's tile of logits, h_tile @ w_tile.T, float32 [rows, vocab]."""
  return jax.lax.dot_general(h_ref[...], w_ref[...], (((1,), (1,)), ((), ())),
                             precision=precision, preferred_element_type=jnp.float32)


def _columns(z, tile: int, axis: int):
  """The vocabulary index of each column of z, whose tile is the grid's `axis`."""
  return pl.program_id(axis) * tile + jax.lax.broadcasted_iota(jnp.int32, z.shape, 1)


def _forward_kernel(h_ref, w_ref, t_ref, top_ref, lse_ref, target_ref, top_s, total_s,
                    target_s, *, vocab_size, tiles, precision):
  @pl.when(pl.program_id(1) == 0)
  def _():
    top_s[...] = jnp.full(top_s.shape, -jnp.inf, jnp.float32)
    total_s[...] = jnp.zeros(total_s.shape, jnp.float32)
    target_s[...] = jnp.zeros(target_s.shape, jnp.float32)

  z = _logits(h_ref, w_ref, precision)
  cols = _columns(z, tiles.vocab, 1)
  z = jnp.where(cols < vocab_size, z, -jnp.inf)
  top = top_s[...]
  new_top = jnp.maximum(top, jnp.max(z, axis=1, keepdims=True))
  total_s[...] = (total_s[...] * jnp.exp(top - new_top)
                  + jnp.sum(jnp.exp(z - new_top), axis=1, keepdims=True))
  target_s[...] += jnp.sum(jnp.where(cols == t_ref[...], z, 0.0), axis=1, keepdims=True)
  top_s[...] = new_top

  @pl.when(pl.program_id(1) == pl.num_programs(1) - 1)
  def _():
    top_ref[...] = top_s[...]
    lse_ref[...] = top_s[...] + jnp.log(total_s[...])
    target_ref[...] = target_s[...]


def _grad_kernel(h_ref, w_ref, t_ref, lse_ref, g_lse_ref, g_target_ref, out_ref, acc, *,
                 tiles, precision, wrt):
  """The gradient of h (`wrt` "h"; grid: row tiles, vocabulary tiles) or of w ("w";
  grid: vocabulary tiles, row tiles): each step's tile of the logits' gradient times
  the other operand's tile, summed in a float32 accumulator over the grid's second
  axis."""
  @pl.when(pl.program_id(1) == 0)
  def _():
    acc[...] = jnp.zeros(acc.shape, jnp.float32)

  z = _logits(h_ref, w_ref, precision)
  vocab_axis, other, contracted = (1, w_ref, 1) if wrt == "h" else (0, h_ref, 0)
  g = logit_gradient(z, _columns(z, tiles.vocab, vocab_axis), t_ref[...], lse_ref[...],
                     g_lse_ref[...], g_target_ref[...]).astype(h_ref.dtype)
  acc[...] += jax.lax.dot_general(g, other[...], (((contracted,), (0,)), ((), ())),
                                  precision=precision, preferred_element_type=jnp.float32)

  @pl.when(pl.program_id(1) == pl.num_programs(1) - 1)
  def _():
    out_ref[...] = acc[...].astype(out_ref.dtype)


def _params(*semantics):
  return pltpu.CompilerParams(dimension_semantics=semantics)


def _padded_operands(h, w, targets, vocab_size, tiles):
  """h, w[:vocab_size] padded with zeros to whole tiles and d to a multiple of 128; the
  targets as a [tokens, 1] column."""
  depth = -(-h.shape[1] // LANES) * LANES
  hp = padded(h, tiles.rows, depth)
  wp = padded(w[:vocab_size], tiles.vocab, depth)
  tp = jnp.pad(targets.astype(jnp.int32), (0, hp.shape[0] - h.shape[0]))[:, None]
  return hp, wp, tp


def _cost(hp, wp, tiles, name: str, rows_axis: int) -> pl.CostEstimate:
  """What kernel `name` does, for XLA's scheduler and its step estimate (which cannot
  see inside a Mosaic kernel): its products of h by w (the kernels table), an exponential per
  logit, and the tiles it streams: the walked operand read once per tile of the
  other."""
  products = kernels.products()[name]
  (n, d), v = hp.shape, wp.shape[0]
  walked = (wp.size * (n // tiles.rows) if rows_axis == 0 else hp.size * (v // tiles.vocab))
  return pl.CostEstimate(flops=2 * n * v * d * products, transcendentals=n * v,
                         bytes_accessed=(hp.size + wp.size + walked) * hp.dtype.itemsize)


def _blocks(tiles, depth, rows_axis):
  """BlockSpecs of h's tile, w's tile and a per-row column, for a grid whose rows are
  its axis `rows_axis` and whose vocabulary is the other."""
  row = (lambda i, j: (i, 0)) if rows_axis == 0 else (lambda j, i: (i, 0))
  col = (lambda i, j: (j, 0)) if rows_axis == 0 else (lambda j, i: (j, 0))
  return (pl.BlockSpec((tiles.rows, depth), row), pl.BlockSpec((tiles.vocab, depth), col),
          pl.BlockSpec((tiles.rows, 1), row))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _statistics(h, w, targets, vocab_size, interpret, tiles):
  return _forward(h, w, targets, vocab_size, interpret, tiles)[0]


def _forward(h, w, targets, vocab_size, interpret, tiles):
  hp, wp, tp = _padded_operands(h, w, targets, vocab_size, tiles)
  h_block, w_block, column = _blocks(tiles, hp.shape[1], rows_axis=0)
  stat = jax.ShapeDtypeStruct((hp.shape[0], 1), jnp.float32)
  top, lse, target = pl.pallas_call(
      functools.partial(_forward_kernel, vocab_size=vocab_size, tiles=tiles,
                        precision=product_precision(h.dtype)),
      out_shape=(stat, stat, stat),
      grid=(hp.shape[0] // tiles.rows, wp.shape[0] // tiles.vocab),
      in_specs=[h_block, w_block, column], out_specs=[column] * 3,
      scratch_shapes=[pltpu.VMEM((tiles.rows, 1), jnp.float32)] * 3,
      compiler_params=_params("parallel", "arbitrary"), interpret=interpret,
      cost_estimate=_cost(hp, wp, tiles, "vocabulary_loss_forward", rows_axis=0),
      name="vocabulary_loss_forward")(hp, wp, tp)
  tokens = h.shape[0]
  return ((top[:tokens, 0], lse[:tokens, 0], target[:tokens, 0]),
          (h, w, targets, lse))


def _backward(vocab_size, interpret, tiles, residuals, cotangents):
  h, w, targets, lse = residuals
  _, g_lse, g_target = cotangents  # The largest logit is only compared: no gradient.
  hp, wp, tp = _padded_operands(h, w, targets, vocab_size, tiles)
  column = lambda g: jnp.pad(g.astype(jnp.float32), (0, hp.shape[0] - h.shape[0]))[:, None]
  operands = (hp, wp, tp, lse, column(g_lse), column(g_target))
  precision, depth = product_precision(h.dtype), hp.shape[1]
  h_block, w_block, row = _blocks(tiles, depth, rows_axis=0)
  dh = pl.pallas_call(
      functools.partial(_grad_kernel, tiles=tiles, precision=precision, wrt="h"),
      out_shape=jax.ShapeDtypeStruct(hp.shape, hp.dtype),
      grid=(hp.shape[0] // tiles.rows, wp.shape[0] // tiles.vocab),
      in_specs=[h_block, w_block] + [row] * 4, out_specs=h_block,
      scratch_shapes=[pltpu.VMEM((tiles.rows, depth), jnp.float32)],
      compiler_params=_params("parallel", "arbitrary"), interpret=interpret,
      cost_estimate=_cost(hp, wp, tiles, "vocabulary_loss_grad_h", rows_axis=0),
      name="vocabulary_loss_grad_h")(*operands)
  h_block, w_block, row = _blocks(tiles, depth, rows_axis=1)
  dw = pl.pallas_call(
      functools.partial(_grad_kernel, tiles=tiles, precision=precision, wrt="w"),
      out_shape=jax.ShapeDtypeStruct(wp.shape, wp.dtype),
      grid=(wp.shape[0] // tiles.vocab, hp.shape[0] // tiles.rows),
      in_specs=[h_block, w_block] + [row] * 4, out_specs=w_block,
      scratch_shapes=[pltpu.VMEM((tiles.vocab, depth), jnp.float32)],
      compiler_params=_params("parallel", "arbitrary"), interpret=interpret,
      cost_estimate=_cost(hp, wp, tiles, "vocabulary_loss_grad_w", rows_axis=1),
      name="vocabulary_loss_grad_w")(*operands)
  tokens, d = h.shape
  dw = jnp.pad(dw[:vocab_size, :d], ((0, w.shape[0] - vocab_size), (0, 0)))
  return dh[:tokens, :d], dw, None


_statistics.defvjp(_forward, _backward)
