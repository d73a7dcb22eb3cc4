"""How far the host runs ahead (transformer_jax/training/run_ahead.py): steps in flight
and prefetched batches."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import toy_data
from transformer_jax.config import TrainConfig
from transformer_jax.data import batching
from transformer_jax.training import run_ahead


def test_prefetched_batches_equal_the_direct_stream_and_stop_cleanly():
  import threading
  data = toy_data(200)
  cfg = TrainConfig(batch_tokens=256, seed=1)
  make = lambda k: batching.train_batch(data, k, cfg, 32)
  direct = [make(k) for k in range(40)]
  for a, b in zip(direct, run_ahead.prefetch(make, range(40), depth=3)):
    np.testing.assert_array_equal(a["inputs"], b["inputs"])

  stream = run_ahead.prefetch(make, range(10**9), depth=2)  # Stopped early.
  next(stream)
  stream.close()
  assert not any(t.name == "prefetch" and t.is_alive() for t in threading.enumerate())

  def broken(k):
    if k == 3:
      raise ValueError("batch 3 is broken")
    return k
  with pytest.raises(ValueError, match="batch 3 is broken"):
    list(run_ahead.prefetch(broken, range(10)))


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
