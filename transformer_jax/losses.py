"""Label-smoothed cross-entropy and the token metrics a translation run reports."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from transformer_jax.tokenizer import PAD_ID


def token_metrics(logits: jax.Array, targets: jax.Array,
                  label_smoothing: float) -> dict[str, jax.Array]:
  """Sums over non-pad target tokens; divide by `tokens` for per-token means.

  Args:
    logits: [batch, length, vocab] float32.
    targets: [batch, length] int; PAD_ID marks padding.
    label_smoothing: epsilon_ls (Sec. 5.4); targets become (1 - eps) * one_hot + eps / V.

  Returns:
    `loss` (smoothed cross-entropy, what is minimised), `nll` (plain negative
    log-likelihood of the reference), `correct` (argmax hits) and `tokens`.
  """
  weights = (targets != PAD_ID).astype(jnp.float32)
  one_hot = jax.nn.one_hot(targets, logits.shape[-1], dtype=jnp.float32)
  smoothed = optax.smooth_labels(one_hot, label_smoothing)
  loss = optax.softmax_cross_entropy(logits, smoothed)
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  return {"loss": jnp.sum(loss * weights), "nll": jnp.sum(nll * weights),
          "correct": jnp.sum(correct * weights), "tokens": jnp.sum(weights)}


def summarize(sums: dict[str, jax.Array | float]) -> dict[str, float]:
  """Per-token loss, nll, perplexity = exp(nll) and accuracy from summed metrics."""
  tokens = max(float(sums["tokens"]), 1.0)
  nll = float(sums["nll"]) / tokens
  return {"loss": float(sums["loss"]) / tokens, "nll": nll,
          "perplexity": float(jnp.exp(jnp.minimum(nll, 80.0))),
          "accuracy": float(sums["correct"]) / tokens, "tokens": float(sums["tokens"])}
