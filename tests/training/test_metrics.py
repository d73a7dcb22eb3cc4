"""The train step's metrics (transformer_jax/training/metrics.py)."""

import jax.numpy as jnp
import numpy as np

from transformer_jax.training import metrics


def test_merged_train_metrics_weigh_tokens_and_leave_out_skipped_steps():
  """Loss and accuracy are per real target token over the merged steps; grad_norm is
  the mean over the steps that updated; a skipped step counts only in skipped_steps."""
  step = lambda loss, tokens, correct, norm, finite: metrics.TrainMetrics.from_step(
      {"loss": jnp.float32(loss), "nll": jnp.float32(loss), "correct": jnp.float32(correct),
       "tokens": jnp.float32(tokens)}, jnp.float32(norm), jnp.bool_(finite))
  total = None
  for args in [(6.0, 3, 3, 1.0, True), (0.0, 0, 0, jnp.nan, False), (2.0, 1, 0, 3.0, True)]:
    total = metrics.merge(total, step(*args))
  values = metrics.summary(total)
  np.testing.assert_allclose([values["loss"], values["accuracy"], values["grad_norm"]],
                             [8 / 4, 3 / 4, 2.0])
  assert (values["tokens"], values["skipped_steps"]) == (4.0, 1.0)
  np.testing.assert_allclose(values["perplexity"], np.exp(2.0), rtol=1e-6)
