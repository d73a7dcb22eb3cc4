"""A jax.profiler trace of a few train steps: the operations that took the most time
(the device's kernels on an accelerator, the host's events on a CPU), and where a step
goes by category (`breakdown`: each kernel of the trace joined to the compiled program's
instruction it ran, `roofline.kernels`), with the time the device sat idle."""

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
from transformer_jax.planning import roofline
from transformer_jax.training import run as run_lib
from transformer_jax.training.step import TrainState


def profile_steps(run: run_lib.Run, state: TrainState,
                  batches: Sequence[dict[str, np.ndarray]], directory: str, top: int = 15
                  ) -> tuple[TrainState, list[dict], list[dict]]:
  """Traces a train step on each of `batches` (shapes already compiled) with
  jax.profiler into `directory` (a Perfetto trace beside TensorBoard's). Returns the
  state after them (the one passed in is donated), the `top` operations by total time
  (the device's kernels on an accelerator, the host's events on a CPU) and the trace's
  events."""
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
  devices = _device_processes(events)
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
  return state, ops, events


def _device_processes(events: list[dict]) -> set[int]:
  processes = {e["pid"]: e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "process_name"}
  return {pid for pid, name in processes.items() if name.startswith("/device:")}


def breakdown(events: list[dict], program: list[roofline.Kernel], steps: int,
              flops_per_s: float, bytes_per_s: float, module: str = "jit_train_step",
              containers: frozenset[str] = frozenset()) -> dict:
  """Milliseconds a step by category: the kernels of `module` in the trace (an
  accelerator's, else the host's XLA thunks), each joined to its instruction in
  `program` by the `hlo_op` the trace records; `idle` is the rest of the span from the
  first kernel to the last (host gaps), so the categories and idle add up to it. Each
  category's floor is its kernels' (`roofline.predict`) at the rates given. Events of
  `containers` (loops, calls: `roofline.containers`) enclose kernels, and are skipped."""
  devices = _device_processes(events)
  by_name = {k.name: k for k in program}
  ran = [e for e in events if e.get("ph") == "X" and e.get("args", {}).get("hlo_op")
         and e["args"]["hlo_op"] not in containers
         and e["args"].get("hlo_module", module) == module
         and (e["pid"] in devices if devices else True)]
  if not ran:
    return {}
  measured, unknown = collections.Counter(), collections.Counter()
  for e in ran:
    kernel = by_name.get(e["args"]["hlo_op"])
    if kernel is None:
      unknown[e["args"]["hlo_op"]] += e.get("dur", 0)
    else:
      measured[kernel.category] += e.get("dur", 0)
  intervals = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in ran)
  busy, end = 0.0, intervals[0][0]
  for start, stop in intervals:  # The union: kernels on several streams overlap.
    busy += max(0.0, stop - max(start, end))
    end = max(end, stop)
  span = end - intervals[0][0]
  floors = roofline.predict(program, flops_per_s, bytes_per_s)["categories"]
  ms = lambda us: us / 1e3 / steps
  rows = {c: {"ms": ms(measured[c]), "floor_ms": floors[c]["ms"]}
          for c in roofline.CATEGORIES}
  rows["not in the program"] = {"ms": ms(sum(unknown.values())), "floor_ms": 0.0}
  rows["idle"] = {"ms": ms(span - busy), "floor_ms": 0.0}
  overlap = sum(measured.values()) + sum(unknown.values()) - busy  # Counted twice above.
  for row in rows.values():
    row["share"] = row["ms"] / ms(span) if span else 0.0
  return {"step_ms": ms(span), "overlap_ms": ms(overlap), "steps": steps,
          "flops_per_s": flops_per_s, "bytes_per_s": bytes_per_s, "categories": rows,
          "not_in_the_program": {name: ms(us) for name, us in unknown.most_common(8)}}


def describe(result: dict) -> list[str]:
  lines = [f"where a step goes (measured over {result['steps']} traced steps): "
           f"{result['step_ms']:.2f} ms from the first kernel to the last; floors at "
           f"{result['flops_per_s'] / 1e12:.3g} TFLOP/s and "
           f"{result['bytes_per_s'] / 1e12:.3g} TB/s measured here",
           f"  {'category':24s} {'ms':>8s} {'share':>6s} {'floor ms':>9s}"]
  for name, row in result["categories"].items():
    lines.append(f"  {name:24s} {row['ms']:8.2f} {100 * row['share']:5.1f}% "
                 f"{row['floor_ms']:9.2f}")
  return lines
