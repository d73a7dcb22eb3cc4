"""The training loop's parts (transformer_jax/loop_parts.py) and its clu metrics."""

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.training import metrics, run_ahead


def test_the_host_runs_at_most_two_steps_ahead_of_the_devices():
  """run_ahead.InFlight as the training loop makes it (its default depth): when step n is
  dispatched, step n - 2 has finished. Unbounded, XLA's CPU client deadlocks once a
  device holds 32 queued launches (run_ahead.InFlight says how)."""
  slow = jax.jit(lambda x: jax.lax.fori_loop(0, 30, lambda _, y: jnp.tanh(y @ y), x))
  x = jnp.ones((384, 384)) / 384
  in_flight, outputs = run_ahead.InFlight(), []
  for _ in range(6):
    outputs.append(slow(x))
    in_flight.add(outputs[-1])
    assert all(y.is_ready() for y in outputs[:-2])


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
