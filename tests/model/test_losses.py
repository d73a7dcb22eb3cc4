"""The label-smoothed cross-entropy (Sec. 5.4) and its one-pass and chunked forms
(transformer_jax/model/losses.py). Each form is compared with the textbook form in
float64; its error is bounded by ROUNDING_K times the control's, the textbook form's
own error in float32 (conftest)."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_within_rounding, relative_difference
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


def _reference_metrics(logits, targets, eps, dtype=jnp.float32):
  """The textbook form in `dtype`: two log-softmaxes and an argmax (optax)."""
  import optax
  logits = logits.astype(dtype)
  weights = (targets != 0).astype(dtype)
  smoothed = optax.smooth_labels(jax.nn.one_hot(targets, logits.shape[-1], dtype=dtype), eps)
  return {"loss": jnp.sum(optax.softmax_cross_entropy(logits, smoothed) * weights),
          "nll": jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, targets)
                         * weights),
          "correct": jnp.sum((jnp.argmax(logits, -1) == targets) * weights),
          "tokens": jnp.sum(weights)}


def _assert_as_accurate(got: dict, textbook32: dict, textbook64: dict) -> None:
  """Each of `got` within ROUNDING_K times the float32 textbook's error, both measured
  from the float64 textbook."""
  assert_within_rounding({k: relative_difference(got[k], textbook64[k]) for k in got},
                         {k: relative_difference(textbook32[k], textbook64[k]) for k in got})


def _values_and_gradient(f, logits, targets, eps):
  """f's metrics and the gradient of its loss - 0.7 nll (any mix of the two)."""
  mix = lambda z: (lambda m: m["loss"] - 0.7 * m["nll"])(f(z, targets, eps))
  return {**f(logits, targets, eps), "gradient": jax.grad(mix)(logits)}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1, 0.3])
def test_one_pass_loss_and_gradient_are_as_accurate_as_the_textbook_form(dtype,
                                                                         label_smoothing):
  """Sec. 5.4's smoothed loss, the nll and the accuracy from one reduction over logits
  kept in the compute dtype, and the gradient written in one pass (one read of the
  logits, one write), against optax's two-pass form, padding included; no scatter is
  left in the compiled gradient, and padding gets none."""
  logits = (3 * jax.random.normal(jax.random.key(0), (4, 9, 50))).astype(dtype)
  targets = jax.random.randint(jax.random.key(1), (4, 9), 0, 50).at[:, -2:].set(0)
  with jax.enable_x64(True):
    truth = _values_and_gradient(functools.partial(_reference_metrics, dtype=jnp.float64),
                                 logits.astype(jnp.float64), targets, label_smoothing)
  control = _values_and_gradient(_reference_metrics, logits, targets, label_smoothing)
  got = _values_and_gradient(losses.token_metrics, logits, targets, label_smoothing)
  assert got["gradient"].dtype == logits.dtype
  control["gradient"] = control["gradient"].astype(logits.dtype)  # Rounded as ours is.
  _assert_as_accurate(got, control, truth)
  assert not np.any(np.asarray(got["gradient"])[:, -2:])
  mix = lambda z: (lambda m: m["loss"] - 0.7 * m["nll"])(
      losses.token_metrics(z, targets, label_smoothing))
  assert "scatter" not in jax.jit(jax.grad(mix)).lower(logits).compile().as_text()


@pytest.mark.parametrize("chunk", [1, 4, 9, 32])
def test_chunked_loss_equals_the_whole_loss_and_its_gradient(chunk):
  """train.loss_chunk_length: the projection and loss chunk by chunk over positions
  (the last chunk padded) give the sums and gradients of all at once, as accurately."""
  states = jax.random.normal(jax.random.key(0), (3, 9, 16))
  kernel = jax.random.normal(jax.random.key(1), (16, 40))
  targets = jax.random.randint(jax.random.key(2), (3, 9), 0, 40).at[2, 5:].set(0)
  def sums(states, kernel, chunked, metrics=losses.token_metrics):
    project = lambda y: y @ kernel
    if chunked:
      return losses.chunked_token_metrics(project, states, targets, 0.1, chunk)
    return metrics(project(states), targets, 0.1)
  def values_and_gradients(chunked, **kwargs):
    gradients = jax.grad(lambda s, w: sums(s, w, chunked, **kwargs)["loss"], argnums=(0, 1))
    return {**sums(states, kernel, chunked, **kwargs),
            **dict(zip(("d_states", "d_kernel"), gradients(states, kernel)))}
  with jax.enable_x64(True):
    f64 = lambda x: x.astype(jnp.float64)
    states, kernel = f64(states), f64(kernel)
    truth = values_and_gradients(False, metrics=functools.partial(
        _reference_metrics, dtype=jnp.float64))
    states, kernel = states.astype(jnp.float32), kernel.astype(jnp.float32)
  _assert_as_accurate(values_and_gradients(True), values_and_gradients(False), truth)


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_the_one_pass_statistics_hold_at_any_scale_and_on_ties(scale):
  """The log-sum-exp kept relative to a running maximum (one reduction over the
  logits) is as accurate as logsumexp at tiny and huge logits alike, and a target tied
  with the largest logit counts as correct."""
  logits = scale * jax.random.normal(jax.random.key(4), (2, 5, 300))
  targets = jnp.argmax(logits, axis=-1).at[0, 0].set(7)
  logits = logits.at[1, 1, 9].set(logits[1, 1].max())  # A tie, with the target (argmax).
  logits = logits.at[1, 1, targets[1, 1]].set(logits[1, 1].max())
  weights = targets != 0
  def textbook(logits):
    lse = jax.nn.logsumexp(logits, axis=-1)
    target = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return {"nll": jnp.sum((lse - target) * weights),
            "log_probs": jnp.where(weights, target - lse, 0.0)}
  with jax.enable_x64(True):
    truth = textbook(logits.astype(jnp.float64))
  got = losses.token_metrics(logits, targets, 0.0)
  _assert_as_accurate({"nll": got["nll"],
                       "log_probs": losses.target_log_probs(logits, targets)},
                      textbook(logits), truth)
  assert got["correct"] == jnp.sum(weights) - (1 if weights[0, 0] else 0)
