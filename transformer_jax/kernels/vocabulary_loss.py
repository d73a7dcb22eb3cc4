"""The output projection and its softmax statistics fused in Pallas kernels for GPUs
(and, through kernels/vocabulary_loss_tpu.py, for TPUs):
a log-sum-exp over the vocabulary that never writes the [tokens, vocabulary] logits.

`statistics(h, w, targets, vocab_size)` gives, for each row of decoder states h
[tokens, d] against the vocabulary's embedding w [>= vocab_size, d] (the tied output
projection, Sec. 3.4), the largest logit, the log-sum-exp and the target's logit, in
float32 from products in h's dtype. That is all the label-smoothed loss needs apart from
the mean logit, which is h . mean(w) (model/losses.py adds it). Three kernels, as in
Apple's Cut Cross-Entropy and Liger's fused linear cross-entropy:

- forward: one program per `block_rows` rows walks the vocabulary `block_vocab` columns
  at a time, keeping the running maximum and the sum of exponentials relative to it
  (flash attention's rescaling), and the target's logit;
- the gradient of h: the same walk, recomputing each tile of logits, turning it into the
  gradient of the logits (softmax times the log-sum-exp's cotangent, plus the target's
  cotangent at the target) and multiplying it by w's tile into a [block_rows, d]
  float32 accumulator;
- the gradient of w: one program per `block_vocab` vocabulary rows walks the tokens,
  likewise, into a [block_vocab, d] accumulator.

Each program owns its output rows: no atomics, so the gradients are the same bits on
every run (resume stays exact). The price is one product recomputed in each backward
kernel: 10 N V d FLOPs where XLA's logits cost 6, for 2 bytes of N x V never written or
read (base's step moves 23 GB in its vocabulary loss; docs/results.md).

Backend: Pallas's Triton lowering (`jax.experimental.pallas.triton`). JAX 0.11.2 marks
it deprecated in favour of Mosaic GPU, but Mosaic GPU runs only on Hopper and later,
its kernels schedule warpgroups and TMA copies by hand, and its API changed between the
JAX versions this project supports (0.10.2-0.11.2); Triton kernels compile for every
GPU JAX supports, from the same code on both versions, and run on the CPU in
interpret mode, where the tests check them. Tiles are powers of two (Triton's rule);
rows, vocabulary and depth are padded to them here, padded columns masked out.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from transformer_jax.kernels import placement
from transformer_jax.kernels.tiles import (logit_gradient, padded, product_precision,
                                           tile_product)


@dataclasses.dataclass(frozen=True)
class Tiles:
  """Tile sizes (powers of two). `depth` is the slice of d one product step reads (the
  walk over d is a loop, so only that slice of h and w is in shared memory at once;
  the defaults, and 128 x 128 forward tiles, compile for an H100 and an H200 at d 512
  and 1024 in bfloat16 and float32: docs/results.md). The accumulators of the backward
  kernels hold whole rows of d."""
  rows: int = 64  # Tokens a forward program owns.
  vocab: int = 64  # Vocabulary columns per step of the walk.
  grad_w_vocab: int = 32  # Vocabulary rows a w-gradient program owns.
  grad_w_rows: int = 32  # Tokens per step of its walk.
  grad_h_rows: int = 16  # Tokens an h-gradient program owns.
  depth: int = 64
  num_warps: int = 4
  num_stages: int = 2


def statistics(h: jax.Array, w: jax.Array, targets: jax.Array, vocab_size: int, *,
               interpret: bool | None = None, tiles=None, backend: str | None = None,
               write_gradient: bool = False) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(largest logit, log-sum-exp, target's logit) of each row of h @ w[:vocab_size].T,
  float32 [tokens]; differentiable in h and w (the largest logit's cotangent is
  ignored: it is only compared).

  Args:
    h: [tokens, d] decoder states, in the compute dtype.
    w: [rows >= vocab_size, d] the output embedding, in the compute dtype.
    targets: [tokens] int, each < vocab_size (padding rows may hold any such id).
    vocab_size: the real vocabulary; w's later rows (vocab_multiple) never count.
    interpret: run the kernels in Pallas's interpreter; None: on a CPU
      (placement.interpret).
    tiles: the backend's tiles; None: Tiles() for GPUs,
      vocabulary_loss_tpu.Tiles() for TPUs.
    backend: "gpu" (these kernels) or "tpu" (kernels/vocabulary_loss_tpu.py); None:
      the platform's (placement.platform), and on a CPU "gpu".
    write_gradient: the backward pass in one kernel that writes the logits' gradient
      [tokens, vocabulary] (in h's dtype) and XLA's two products of it (cuBLAS's on a
      GPU): 8 N V d FLOPs in all, where the fused backward's are 10 and XLA's loss's 6
      with the logits written and read twice. GPUs only.
  """
  interpret = placement.interpret() if interpret is None else interpret
  if (backend or placement.platform()) == "tpu":
    if write_gradient:
      raise ValueError("write_gradient has GPU kernels only")
    from transformer_jax.kernels import vocabulary_loss_tpu
    return vocabulary_loss_tpu.statistics(h, w, targets, vocab_size, interpret,
                                          tiles or vocabulary_loss_tpu.Tiles())
  tiles = tiles or Tiles()
  return _statistics(h, w, targets, vocab_size, interpret, tiles, write_gradient)


def _depth(d: int) -> int:
  return max(pl.next_power_of_2(d), 16)


def _forward_kernel(h_ref, w_ref, t_ref, top_ref, lse_ref, target_ref, *, vocab_size,
                    tiles, precision):
  rows = tiles.rows
  targets = t_ref[...]

  def walk(j, carry):
    top, total, target = carry
    start = j * tiles.vocab
    z = tile_product(h_ref, w_ref, 0, start, rows, tiles.vocab, tiles.depth, precision)
    cols = start + jax.lax.broadcasted_iota(jnp.int32, z.shape, 1)
    z = jnp.where(cols < vocab_size, z, -jnp.inf)
    new_top = jnp.maximum(top, jnp.max(z, axis=1))
    total = total * jnp.exp(top - new_top) + jnp.sum(jnp.exp(z - new_top[:, None]), axis=1)
    target = target + jnp.sum(jnp.where(cols == targets[:, None], z, 0.0), axis=1)
    return new_top, total, target

  init = (jnp.full((rows,), -jnp.inf, jnp.float32), jnp.zeros((rows,), jnp.float32),
          jnp.zeros((rows,), jnp.float32))
  top, total, target = jax.lax.fori_loop(0, pl.cdiv(vocab_size, tiles.vocab), walk, init)
  top_ref[...] = top
  lse_ref[...] = top + jnp.log(total)
  target_ref[...] = target


def _grad_h_kernel(h_ref, w_ref, t_ref, lse_ref, g_lse_ref, g_target_ref, dh_ref, *,
                   vocab_size, tiles, precision):
  rows, depth = tiles.grad_h_rows, h_ref.shape[1]
  targets, lse = t_ref[...], lse_ref[...]
  g_lse, g_target = g_lse_ref[...], g_target_ref[...]
  step = min(tiles.depth, depth)
  chunks = range(0, depth, step)

  def walk(j, acc):
    start = j * tiles.vocab
    z = tile_product(h_ref, w_ref, 0, start, rows, tiles.vocab, tiles.depth, precision)
    cols = start + jax.lax.broadcasted_iota(jnp.int32, z.shape, 1)
    g = logit_gradient(z, cols, targets[:, None], lse[:, None], g_lse[:, None],
                       g_target[:, None]).astype(w_ref.dtype)
    return tuple(a + jax.lax.dot_general(
        g, w_ref[pl.ds(start, tiles.vocab), pl.ds(k, step)],
        (((1,), (0,)), ((), ())), precision=precision, preferred_element_type=jnp.float32)
                 for a, k in zip(acc, chunks))

  init = tuple(jnp.zeros((rows, step), jnp.float32) for _ in chunks)
  acc = jax.lax.fori_loop(0, pl.cdiv(vocab_size, tiles.vocab), walk, init)
  for a, k in zip(acc, chunks):
    dh_ref[:, pl.ds(k, step)] = a.astype(dh_ref.dtype)


def _grad_logits_kernel(h_ref, w_ref, t_ref, lse_ref, g_lse_ref, g_target_ref, g_ref, *,
                        vocab_size, tiles, precision):
  """One [rows, vocab] tile of the logits' gradient (zero in padded columns)."""
  z = tile_product(h_ref, w_ref, 0, 0, tiles.rows, tiles.vocab, tiles.depth, precision)
  cols = (pl.program_id(1) * tiles.vocab +
          jax.lax.broadcasted_iota(jnp.int32, z.shape, 1))
  g = logit_gradient(z, cols, *(ref[...][:, None] for ref in (
      t_ref, lse_ref, g_lse_ref, g_target_ref)))
  g_ref[...] = jnp.where(cols < vocab_size, g, 0.0).astype(g_ref.dtype)


def _grad_w_kernel(h_ref, w_ref, t_ref, lse_ref, g_lse_ref, g_target_ref, dw_ref, *,
                   tiles, precision):
  cols_tile, rows, depth = tiles.grad_w_vocab, tiles.grad_w_rows, h_ref.shape[1]
  start = pl.program_id(0) * cols_tile
  step = min(tiles.depth, depth)
  chunks = range(0, depth, step)

  def walk(i, acc):
    first = i * rows
    z = tile_product(h_ref, w_ref, first, start, rows, cols_tile, tiles.depth, precision)
    cols = start + jax.lax.broadcasted_iota(jnp.int32, z.shape, 1)
    span = pl.ds(first, rows)
    g = logit_gradient(z, cols, *(ref[span][:, None] for ref in (
        t_ref, lse_ref, g_lse_ref, g_target_ref))).astype(h_ref.dtype)
    return tuple(a + jax.lax.dot_general(
        g, h_ref[span, pl.ds(k, step)], (((0,), (0,)), ((), ())),
        precision=precision, preferred_element_type=jnp.float32)
                 for a, k in zip(acc, chunks))

  init = tuple(jnp.zeros((cols_tile, step), jnp.float32) for _ in chunks)
  acc = jax.lax.fori_loop(0, h_ref.shape[0] // rows, walk, init)
  for a, k in zip(acc, chunks):
    dw_ref[:, pl.ds(k, step)] = a.astype(dw_ref.dtype)


def _compiler(tiles: Tiles, interpret):
  return placement.triton_params(interpret, num_warps=tiles.num_warps,
                                   num_stages=tiles.num_stages)


def _row_block(rows: int, depth: int | None = None):
  shape = (rows,) if depth is None else (rows, depth)
  return pl.BlockSpec(shape, lambda i: (i,) if depth is None else (i, 0))


def _whole(shape):
  return pl.BlockSpec(shape, lambda i: (0,) * len(shape))


def _padded_operands(h, w, targets, vocab_size, tiles):
  """h, w[:vocab_size] and the targets padded to whole tiles (zeros; padded rows'
  cotangents are 0, padded columns are masked in the kernels)."""
  depth = _depth(h.shape[1])
  hp = padded(h, max(tiles.rows, tiles.grad_w_rows, tiles.grad_h_rows), depth)
  wp = padded(w[:vocab_size], max(tiles.vocab, tiles.grad_w_vocab), depth)
  tp = jnp.pad(targets.astype(jnp.int32), (0, hp.shape[0] - h.shape[0]))
  return hp, wp, tp


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _statistics(h, w, targets, vocab_size, interpret, tiles, write_gradient):
  return _forward(h, w, targets, vocab_size, interpret, tiles, write_gradient)[0]


def _forward(h, w, targets, vocab_size, interpret, tiles, write_gradient):
  hp, wp, tp = _padded_operands(h, w, targets, vocab_size, tiles)
  stats = jax.ShapeDtypeStruct((hp.shape[0],), jnp.float32)
  top, lse, target = pl.pallas_call(
      functools.partial(_forward_kernel, vocab_size=vocab_size, tiles=tiles,
                        precision=product_precision(h.dtype)),
      out_shape=(stats, stats, stats), grid=(hp.shape[0] // tiles.rows,),
      in_specs=[_row_block(tiles.rows, hp.shape[1]), _whole(wp.shape),
                _row_block(tiles.rows)],
      out_specs=[_row_block(tiles.rows)] * 3, compiler_params=_compiler(tiles, interpret),
      interpret=interpret, name="vocabulary_loss_forward")(hp, wp, tp)
  tokens = h.shape[0]
  return (top[:tokens], lse[:tokens], target[:tokens]), (h, w, targets, lse)


def _backward(vocab_size, interpret, tiles, write_gradient, residuals, cotangents):
  h, w, targets, lse = residuals
  _, g_lse, g_target = cotangents  # The largest logit is only compared: no gradient.
  hp, wp, tp = _padded_operands(h, w, targets, vocab_size, tiles)
  pad = (0, hp.shape[0] - h.shape[0])
  operands = (hp, wp, tp, lse, jnp.pad(g_lse.astype(jnp.float32), pad),
              jnp.pad(g_target.astype(jnp.float32), pad))
  options = dict(tiles=tiles, precision=product_precision(h.dtype))
  if write_gradient:
    dh, dw = _gradients_from_logits(operands, vocab_size, interpret, **options)
  else:
    dh, dw = _gradients_fused(operands, vocab_size, interpret, **options)
  tokens, d = h.shape
  dw = jnp.pad(dw[:vocab_size, :d], ((0, w.shape[0] - vocab_size), (0, 0)))
  return dh[:tokens, :d], dw, None


def _gradients_from_logits(operands, vocab_size, interpret, tiles, precision):
  """The logits' gradient written by one kernel, then h's and w's by XLA's products."""
  hp, wp = operands[:2]
  rows, vocab, depth = tiles.rows, tiles.vocab, hp.shape[1]
  by_row = lambda *shape: pl.BlockSpec(shape, lambda i, j: (i,) + (0,) * (len(shape) - 1))
  g = pl.pallas_call(
      functools.partial(_grad_logits_kernel, vocab_size=vocab_size, tiles=tiles,
                        precision=precision),
      out_shape=jax.ShapeDtypeStruct((hp.shape[0], wp.shape[0]), hp.dtype),
      grid=(hp.shape[0] // rows, wp.shape[0] // vocab),
      in_specs=[by_row(rows, depth), pl.BlockSpec((vocab, depth), lambda i, j: (j, 0))]
               + [by_row(rows)] * 4,
      out_specs=pl.BlockSpec((rows, vocab), lambda i, j: (i, j)),
      compiler_params=_compiler(tiles, interpret), interpret=interpret,
      name="vocabulary_loss_grad_logits")(*operands)
  product = lambda a, b, axis: jax.lax.dot_general(a, b, (((axis,), (0,)), ((), ())),
                                                   precision=precision)
  return product(g, wp, 1), product(g, hp, 0)


def _gradients_fused(operands, vocab_size, interpret, tiles, precision):
  """h's gradient by one kernel per row tile, w's by one per vocabulary tile."""
  hp, wp = operands[:2]
  options = dict(tiles=tiles, precision=precision)
  rows, depth = tiles.grad_h_rows, hp.shape[1]
  dh = pl.pallas_call(
      functools.partial(_grad_h_kernel, vocab_size=vocab_size, **options),
      out_shape=jax.ShapeDtypeStruct(hp.shape, hp.dtype), grid=(hp.shape[0] // rows,),
      in_specs=[_row_block(rows, depth), _whole(wp.shape)] + [_row_block(rows)] * 4,
      out_specs=_row_block(rows, depth), compiler_params=_compiler(tiles, interpret),
      interpret=interpret, name="vocabulary_loss_grad_h")(*operands)
  cols = tiles.grad_w_vocab
  dw = pl.pallas_call(
      functools.partial(_grad_w_kernel, **options),
      out_shape=jax.ShapeDtypeStruct(wp.shape, wp.dtype), grid=(wp.shape[0] // cols,),
      in_specs=[_whole(hp.shape), _whole(wp.shape)] + [_whole(operands[3].shape)] * 4,
      out_specs=_row_block(cols, depth), compiler_params=_compiler(tiles, interpret),
      interpret=interpret, name="vocabulary_loss_grad_w")(*operands)
  return dh, dw


_statistics.defvjp(_forward, _backward)
