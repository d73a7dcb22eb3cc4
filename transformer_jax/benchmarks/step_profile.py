"""A jax.profiler trace of a few train steps, and the operations that took the most
time: the device's kernels on an accelerator, the host's events on a CPU."""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
from typing import Sequence

import jax
import numpy as np

from transformer_jax import partitioning
from transformer_jax.training import run as run_lib
from transformer_jax.training.step import TrainState


def profile_steps(run: run_lib.Run, state: TrainState,
                  batches: Sequence[dict[str, np.ndarray]], directory: str, top: int = 15
                  ) -> tuple[TrainState, list[dict]]:
  """Traces a train step on each of `batches` (shapes already compiled) with jax.profiler into
  `directory` (a Perfetto trace beside TensorBoard's), and returns the `top` operations
  by total time: the device's kernels on an accelerator, the host's events on a CPU.
  Returns the state after them (the one passed in is donated) and those operations."""
  with run.activate(), jax.profiler.trace(directory, create_perfetto_trace=True):
    for batch in batches:
      state, out = run.train_step(state, partitioning.shard_batch(batch, run.mesh),
                                  run.dropout_key)
    jax.block_until_ready(out)
  path = sorted(glob.glob(os.path.join(directory, "**", "perfetto_trace.json.gz"),
                          recursive=True))[-1]
  with gzip.open(path) as f:
    events = json.load(f)
  events = events["traceEvents"] if isinstance(events, dict) else events
  processes = {e["pid"]: e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "process_name"}
  devices = {pid for pid, name in processes.items() if name.startswith("/device:")}
  totals = collections.Counter()
  for e in events:
    if e.get("ph") == "X" and (e["pid"] in devices if devices else
                               not e["name"].startswith("$")):
      totals[e["name"]] += e.get("dur", 0) / 1e3  # ms
  everything = sum(totals.values()) or 1.0
  ops = [{"name": name, "ms": ms / len(batches), "fraction": ms / everything}
         for name, ms in totals.most_common(top)]
  print(f"profile: {path}; top operations by time per step:")
  for op in ops[:8]:
    print(f"  {op['ms']:9.2f} ms  {100 * op['fraction']:5.1f}%  {op['name'][:90]}")
  return state, ops
