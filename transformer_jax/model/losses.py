"""Label-smoothed cross-entropy and the token metrics a translation run reports."""

from __future__ import annotations

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
  weights = (targets != PAD_ID).astype(jnp.float32)
  f32 = lambda x: x.astype(jnp.float32)
  top, lse, target = _max_lse_and_target(logits, targets)
  nll = lse - f32(target)
  loss = (1.0 - label_smoothing) * nll + label_smoothing * (
      lse - jnp.mean(f32(logits), axis=-1))
  correct = (target >= top).astype(jnp.float32)
  return {"loss": jnp.sum(loss * weights), "nll": jnp.sum(nll * weights),
          "correct": jnp.sum(correct * weights), "tokens": jnp.sum(weights)}


def _max_lse_and_target(logits: jax.Array, targets: jax.Array
                        ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Per position: the largest logit, logsumexp(z) in float32 and the target's logit,
  from logits read in their own dtype (no float32 copy of [tokens, vocab] is made)."""
  top = jax.lax.stop_gradient(jnp.max(logits, axis=-1))  # Exact in any dtype.
  f32 = lambda x: x.astype(jnp.float32)
  lse = jnp.log(jnp.sum(jnp.exp(f32(logits) - f32(top)[..., None]), axis=-1)) + f32(top)
  target = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  return top, lse, target


def target_log_probs(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """log P(target token) at each position [batch, length], float32, 0 at padding:
  the teacher-forced log-probability that `token_metrics`' nll negates and sums."""
  _, lse, target = _max_lse_and_target(logits, targets)
  return jnp.where(targets != PAD_ID, target.astype(jnp.float32) - lse, 0.0)


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

