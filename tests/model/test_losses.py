"""The label-smoothed cross-entropy (Sec. 5.4) and its one-pass and chunked forms
(transformer_jax/model/losses.py)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.model import losses
from transformer_jax.training import metrics


def test_label_smoothed_loss_matches_a_hand_computation():
  """Sec. 5.4, eps = 0.1: target distribution (1 - eps) * one_hot + eps / V, over all V
  tokens (Szegedy et al.'s uniform prior), not the V - 1 others: the target's logit
  (0.5) is not the mean logit (1.0), so the two differ."""
  logits = jnp.array([[[2.5, 0.5, 0.0], [0.0, 1.0, 3.0]]])
  targets = jnp.array([[1, 0]])  # The second position is padding.
  sums = losses.token_metrics(logits, targets, label_smoothing=0.1)
  z = np.array([2.5, 0.5, 0.0])
  log_p = z - math.log(np.exp(z).sum())
  q = np.array([0.1 / 3, 0.9 + 0.1 / 3, 0.1 / 3])
  np.testing.assert_allclose(float(sums["loss"]), -(q * log_p).sum(), rtol=1e-6)
  np.testing.assert_allclose(float(sums["nll"]), -log_p[1], rtol=1e-6)
  assert float(sums["tokens"]) == 1.0 and float(sums["correct"]) == 0.0
  summary = metrics.summary(metrics.EvalMetrics.from_sums(sums))
  np.testing.assert_allclose(summary["perplexity"], math.exp(-log_p[1]), rtol=1e-5)


def _reference_metrics(logits, targets, eps):
  """The textbook form: two log-softmaxes over float32 logits and an argmax (optax)."""
  import optax
  logits = logits.astype(jnp.float32)
  weights = (targets != 0).astype(jnp.float32)
  smoothed = optax.smooth_labels(jax.nn.one_hot(targets, logits.shape[-1]), eps)
  return {"loss": jnp.sum(optax.softmax_cross_entropy(logits, smoothed) * weights),
          "nll": jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, targets)
                         * weights),
          "correct": jnp.sum((jnp.argmax(logits, -1) == targets) * weights),
          "tokens": jnp.sum(weights)}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_one_pass_loss_equals_the_textbook_form_and_its_gradient(dtype):
  """Sec. 5.4's smoothed loss, the nll and the accuracy from one log-sum-exp over logits
  kept in the compute dtype equal optax's two-pass float32 form, values and gradients."""
  logits = (3 * jax.random.normal(jax.random.key(0), (4, 9, 50))).astype(dtype)
  targets = jax.random.randint(jax.random.key(1), (4, 9), 0, 50)
  got, expected = (f(logits, targets, 0.1) for f in (losses.token_metrics,
                                                     _reference_metrics))
  for k in losses.METRICS:
    np.testing.assert_allclose(got[k], expected[k], rtol=1e-5)
  grad = lambda f: jax.grad(lambda z: f(z, targets, 0.1)["loss"])(logits.astype(jnp.float32))
  np.testing.assert_allclose(grad(losses.token_metrics), grad(_reference_metrics), atol=1e-6)


@pytest.mark.parametrize("chunk", [1, 4, 9, 32])
def test_chunked_loss_equals_the_whole_loss_and_its_gradient(chunk):
  """train.loss_chunk_length: the projection and loss chunk by chunk over positions
  (the last chunk padded) give the same sums and gradients as all at once."""
  states = jax.random.normal(jax.random.key(0), (3, 9, 16))
  kernel = jax.random.normal(jax.random.key(1), (16, 40))
  targets = jax.random.randint(jax.random.key(2), (3, 9), 0, 40).at[2, 5:].set(0)
  def sums(states, kernel, chunked):
    project = lambda y: y @ kernel
    if chunked:
      return losses.chunked_token_metrics(project, states, targets, 0.1, chunk)
    return losses.token_metrics(project(states), targets, 0.1)
  for k in losses.METRICS:
    np.testing.assert_allclose(sums(states, kernel, True)[k],
                               sums(states, kernel, False)[k], rtol=1e-5)
  grads = [jax.grad(lambda s, w: sums(s, w, chunked)["loss"], argnums=(0, 1))(states, kernel)
           for chunked in (True, False)]
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), *grads)


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_the_statistics_hold_at_any_scale_and_on_ties(scale):
  """The log-sum-exp taken relative to the largest logit equals logsumexp at tiny and
  huge logits alike, and a target tied with the largest logit counts as correct."""
  logits = scale * jax.random.normal(jax.random.key(4), (2, 5, 300))
  targets = jnp.argmax(logits, axis=-1).at[0, 0].set(7)
  logits = logits.at[1, 1, 9].set(logits[1, 1].max())  # A tie, with the target (argmax).
  logits = logits.at[1, 1, targets[1, 1]].set(logits[1, 1].max())
  got = losses.token_metrics(logits, targets, 0.0)
  lse = jax.nn.logsumexp(logits.astype(jnp.float64) if jax.config.x64_enabled else logits,
                         axis=-1)
  target = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  weights = targets != 0
  np.testing.assert_allclose(got["nll"], jnp.sum((lse - target) * weights), rtol=1e-5,
                             atol=1e-5)
  assert got["correct"] == jnp.sum(weights) - (1 if weights[0, 0] else 0)
  logp = losses.target_log_probs(logits, targets)
  np.testing.assert_allclose(logp, jnp.where(weights, target - lse, 0.0), rtol=1e-5,
                             atol=1e-5)
