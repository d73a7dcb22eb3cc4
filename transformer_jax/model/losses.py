"""Label-smoothed cross-entropy and the token metrics a translation run reports."""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp

from transformer_jax.config import PAD_ID

METRICS = ("loss", "nll", "correct", "tokens")


def token_metrics(logits: jax.Array, targets: jax.Array,
                  label_smoothing: float) -> dict[str, jax.Array]:
  """Sums over non-pad target tokens; divide by `tokens` for per-token means.

  One pass over the logits, read in their compute dtype (bfloat16 in mixed precision)
  and widened to float32 only inside the reductions, so no float32 [tokens, vocab]
  array is made. With z the logits, t the target and V the vocabulary, the smoothed
  targets (1 - eps) one_hot(t) + eps / V (Sec. 5.4) give

    loss = (1 - eps) (lse(z) - z_t) + eps (lse(z) - mean(z)),   nll = lse(z) - z_t.

  Args:
    logits: [batch, length, vocab], any float dtype.
    targets: [batch, length] int; PAD_ID marks padding.
    label_smoothing: epsilon_ls.

  Returns:
    `loss` (smoothed cross-entropy, what is minimised), `nll` (plain negative
    log-likelihood of the reference), `correct` (the reference has the largest logit;
    ties count) and `tokens`.
  """
  loss, nll, top, target = _smoothed_cross_entropy(logits, targets, label_smoothing)
  return _sums(loss, nll, top, target, targets)


def _sums(loss, nll, top, target, targets) -> dict[str, jax.Array]:
  weights = (targets != PAD_ID).astype(jnp.float32)
  correct = (target >= top).astype(jnp.float32)
  return {"loss": jnp.sum(loss * weights), "nll": jnp.sum(nll * weights),
          "correct": jnp.sum(correct * weights), "tokens": jnp.sum(weights)}


def fused_token_metrics(states: jax.Array, embedding: jax.Array, targets: jax.Array,
                        label_smoothing: float, vocab_size: int,
                        interpret: bool | None = None, tiles=None, backend: str | None = None,
                        write_gradient: bool = False) -> dict[str, jax.Array]:
  """`token_metrics` of the logits states @ embedding[:vocab_size].T, by the fused
  Pallas kernels (kernels/vocabulary_loss.py), which never write them: the kernels give
  each position's largest logit, log-sum-exp and target logit; the mean logit of the
  smoothing term is states . mean(embedding rows), exactly (Sec. 5.4).

  Args:
    states: [..., d_model] the decoder's output, in the compute dtype.
    embedding: [>= vocab_size, d_model] the output projection's rows (the tied
      embedding), in the compute dtype.
    targets: [...] int; PAD_ID marks padding.
    interpret: run the kernels in Pallas's interpreter; None: on a CPU.
    tiles: the kernels' tiles; None: their defaults.
    backend: "gpu" or "tpu" kernels; None: the platform's (vocabulary_loss.statistics).
    write_gradient: the backward writes the logits' gradient for XLA's two products
      (train.loss_kernel="hybrid"; vocabulary_loss.statistics).
  """
  from transformer_jax.kernels import vocabulary_loss  # Pallas: imported when used.

  h = states.reshape(-1, states.shape[-1])
  t = targets.reshape(-1)
  top, lse, target = vocabulary_loss.statistics(h, embedding, t, vocab_size,
                                                interpret=interpret, tiles=tiles,
                                                backend=backend,
                                                write_gradient=write_gradient)
  mean_row = jnp.mean(embedding[:vocab_size].astype(jnp.float32), axis=0)
  mean = jnp.dot(h.astype(jnp.float32), mean_row, precision=jax.lax.Precision.HIGHEST)
  nll = lse - target
  loss = (1.0 - label_smoothing) * nll + label_smoothing * (lse - mean)
  return _sums(loss, nll, top, target, t)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _smoothed_cross_entropy(logits: jax.Array, targets: jax.Array, label_smoothing: float
                            ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Per position: the smoothed loss and the nll (float32), the largest logit and the
  target's logit. Its gradient is written in one pass over the logits (below)."""
  return _smoothed_cross_entropy_forward(logits, targets, label_smoothing)[0]


def _smoothed_cross_entropy_forward(logits, targets, label_smoothing):
  top, lse, target, total = _statistics(logits, targets)
  nll = lse - target
  loss = (1.0 - label_smoothing) * nll + label_smoothing * (
      lse - total / logits.shape[-1])
  return (loss, nll, top, target), (logits, targets, lse)


def _smoothed_cross_entropy_backward(label_smoothing, residuals, cotangents):
  """d/dz of a g_loss loss + g_nll nll = (g_loss + g_nll) softmax(z) - (g_loss (1 - eps)
  + g_nll) one_hot(t) - g_loss eps / V: one read of the logits and one write of their
  gradient, where autodiff of the forward pass writes [tokens, vocab] arrays several
  times (a scatter for the target's logit among them)."""
  logits, targets, lse = residuals
  g_loss, g_nll = cotangents[0][..., None], cotangents[1][..., None]
  eps, vocab = label_smoothing, logits.shape[-1]
  softmax = jnp.exp(logits.astype(jnp.float32) - lse[..., None])
  is_target = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1) == \
      targets[..., None]
  grad = ((g_loss + g_nll) * softmax - jnp.where(is_target, g_loss * (1 - eps) + g_nll, 0.0)
          - g_loss * eps / vocab)
  return grad.astype(logits.dtype), None


_smoothed_cross_entropy.defvjp(_smoothed_cross_entropy_forward,
                               _smoothed_cross_entropy_backward)


def _statistics(logits: jax.Array, targets: jax.Array
                ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Per position, in float32: the largest logit, logsumexp(z), the target's logit and
  the sum of the logits, in one pass over logits read in their own dtype (one reduction
  of four values; no float32 copy of [tokens, vocab] is made, none is read twice). The
  log-sum-exp is kept relative to the running maximum, as flash attention does."""
  x = logits.astype(jnp.float32)
  is_target = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1) == targets[..., None]

  def combine(a, b):
    (top_a, sum_a, target_a, total_a), (top_b, sum_b, target_b, total_b) = a, b
    top = jnp.maximum(top_a, top_b)
    rescaled = lambda t, s: jnp.where(s > 0, s * jnp.exp(t - top), 0.0)  # 0 if empty.
    return (top, rescaled(top_a, sum_a) + rescaled(top_b, sum_b), target_a + target_b,
            total_a + total_b)

  top, sum_exp, target, total = jax.lax.reduce(
      (x, jnp.ones_like(x), jnp.where(is_target, x, 0.0), x),
      (jnp.float32(-jnp.inf), jnp.float32(0), jnp.float32(0), jnp.float32(0)), combine,
      (x.ndim - 1,))
  return top, top + jnp.log(sum_exp), target, total


def target_log_probs(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """log P(target token) at each position [batch, length], float32, 0 at padding:
  the teacher-forced log-probability that `token_metrics`' nll negates and sums."""
  _, lse, target, _ = _statistics(logits, targets)
  return jnp.where(targets != PAD_ID, target - lse, 0.0)


def chunked_token_metrics(project: Callable[[jax.Array], jax.Array], states: jax.Array,
                          targets: jax.Array, label_smoothing: float,
                          chunk_length: int) -> dict[str, jax.Array]:
  """`token_metrics(project(states), ...)` computed `chunk_length` target positions at a
  time, so that no [tokens, vocab] array exists: a scan over position chunks (rows stay
  where the batch sharding put them), each chunk rematerialised in the backward pass.

  Args:
    project: decoder states [batch, n, d_model] -> logits [batch, n, vocab].
    states: [batch, length, d_model], the decoder's output.
    targets: [batch, length].
  """
  batch, length, width = states.shape
  pad = -length % chunk_length
  states = jnp.pad(states, ((0, 0), (0, pad), (0, 0)))
  targets = jnp.pad(targets, ((0, 0), (0, pad)), constant_values=PAD_ID)
  chunks = (length + pad) // chunk_length
  # [chunks, batch, chunk_length, ...]: the batch axis keeps its sharding.
  xs = (states.reshape(batch, chunks, chunk_length, width).swapaxes(0, 1),
        targets.reshape(batch, chunks, chunk_length).swapaxes(0, 1))

  @jax.checkpoint
  def add_chunk(total, chunk):
    sums = token_metrics(project(chunk[0]), chunk[1], label_smoothing)
    return jax.tree.map(jnp.add, total, sums), None

  zeros = {k: jnp.zeros((), jnp.float32) for k in METRICS}
  return jax.lax.scan(add_chunk, zeros, xs)[0]

