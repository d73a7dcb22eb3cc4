"""Timed train steps and what they are measured against: tokens/s, MFU on real tokens
and on computed positions (FLOPs per token: transformer.train_flops_per_target_token), the
device's peak (datasheets; measured on a CPU) and peak memory."""

from __future__ import annotations

import resource
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax import partitioning
from transformer_jax.data import parallel_data
from transformer_jax.model import transformer as model_lib
from transformer_jax.planning.topology import datasheet_peak
from transformer_jax.training import run as run_lib
from transformer_jax.training.step import TrainState


def device_peak_flops(dtype: str, peak_tflops: float | None = None
                      ) -> tuple[float | None, str]:
  """(per-device peak FLOP/s or None if unknown, where the number came from)."""
  if peak_tflops:
    return peak_tflops * 1e12, "--peak_tflops"
  device = jax.devices()[0]
  if sheet := datasheet_peak(device.device_kind):
    return sheet[0] * 1e12, f"{sheet[1]}, dense bf16"
  if device.platform != "cpu":
    return None, f"unknown peak for {device.device_kind!r} (give --peak_tflops)"
  # A CPU: measure a large matrix product now. 2048 reaches 4096's rate here (2 cores:
  # 82-117 GFLOP/s against 79-104), in 1 s instead of 8-10.
  n = 2048
  seconds = median_seconds(lambda x: x @ x, jnp.ones((n, n), jnp.dtype(dtype)))
  return 2 * n**3 / seconds, f"measured ({n}^3 {dtype} matmul)"


def median_seconds(fn: Callable, *args, repeats: int = 5) -> float:
  """The median of `repeats` timed calls of jax.jit(fn)(*args), each waited for, after
  one untimed (the compile)."""
  fn = jax.jit(fn)
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def measured_rates(dtype: str = "bfloat16") -> tuple[float, float]:
  """The two ceilings of this device, measured now (median of 5 after a warm-up): FLOP/s
  of a square matrix product of `dtype` on random data (8192 on an accelerator, 1024 on
  a CPU) and bytes a second of an element-wise pass over 1 GiB of it (read plus
  written; 64 MiB on a CPU)."""
  cpu = jax.devices()[0].platform == "cpu"
  n, size = (1024, 2**26) if cpu else (8192, 2**30)
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.dtype(dtype))
  x = jax.random.normal(jax.random.key(1), (size // jnp.dtype(dtype).itemsize,),
                        jnp.dtype(dtype))
  flops = 2 * n**3 / median_seconds(lambda m: m @ m, a)
  return flops, 2 * x.nbytes / median_seconds(lambda v: v * 2, x)


def peak_memory_bytes() -> tuple[int, str]:
  stats = jax.devices()[0].memory_stats()
  if stats and "peak_bytes_in_use" in stats:
    return stats["peak_bytes_in_use"], "device peak"
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "host peak RSS"


def time_steps(step: Callable[[dict], None], batches: Sequence[dict[str, np.ndarray]],
               steps: int, warmup_steps: int, sync: Callable[[], None]) -> dict:
  """`step(batch)` once for each batch shape among the first `warmup_steps + steps`
  batches and on the first `warmup_steps`, untimed (compiles, caches), then on each of
  the next `steps` alone, waiting for the device (`sync`) around each. Returns the
  warm-up's seconds, the timed steps' (in all, median, 10th and 90th percentiles) and
  their real (non-pad) target tokens a second."""
  batches = batches[:warmup_steps + steps]
  start = time.perf_counter()
  one_of_each_shape = {b["inputs"].shape: b for b in batches}.values()
  for batch in [*one_of_each_shape, *batches[:warmup_steps]]:
    step(batch)
  sync()
  warmup_seconds, seconds = time.perf_counter() - start, []
  for batch in batches[warmup_steps:]:
    start = time.perf_counter()
    step(batch)
    sync()
    seconds.append(time.perf_counter() - start)
  real = sum(int((b["targets"] != 0).sum()) for b in batches[warmup_steps:])
  p10, median, p90 = np.percentile(seconds, [10, 50, 90])
  return {"steps": len(seconds), "seconds": sum(seconds), "warmup_s": warmup_seconds,
          "step_s": float(median), "step_s_p10": float(p10), "step_s_p90": float(p90),
          "tokens_per_s": real / sum(seconds)}


def batch_shapes(batches: Sequence[dict[str, np.ndarray]]) -> list[dict[str, tuple]]:
  """Each shape among `batches` once: the train programs to compile ahead."""
  return list({b["inputs"].shape: {k: v.shape for k, v in b.items()}
               for b in batches}.values())


def benchmark_training(run: run_lib.Run, state: TrainState,
                       batches: Sequence[dict[str, np.ndarray]],
                       data: parallel_data.ParallelData, steps: int, warmup_steps: int = 2,
                       peak_tflops: float | None = None) -> tuple[TrainState, dict]:
  """Times `steps` train steps (`time_steps`; each batch shape compiled ahead:
  compilation.train_programs); returns the state after them (the one passed in is
  donated) and the figures, the peak memory among them (training's alone, when nothing
  else ran before)."""
  cfg = run.cfg
  num_params = sum(x.size for x in jax.tree.leaves(state.params))
  live = {"state": state}
  def run_step(batch):
    live["state"], live["out"] = run.train_step(
        live["state"], partitioning.shard_batch(batch, run.mesh), run.dropout_key)
  with run.activate():
    timed = time_steps(run_step, batches, steps, warmup_steps,
                       lambda: jax.block_until_ready(live["out"]))
  widths = [b["targets"].shape for b in batches[warmup_steps:warmup_steps + steps]]
  total, real = timed["seconds"], timed["tokens_per_s"] * timed["seconds"]
  computed = sum(rows * width for rows, width in widths)
  flops = lambda length: model_lib.train_flops_per_target_token(cfg.model, num_params,
                                                                  length)
  mean_length = float(np.mean(data.targets.lengths))
  mean_width = float(np.mean([width for _, width in widths]))
  peak, peak_source = device_peak_flops(cfg.model.dtype, peak_tflops)
  memory, memory_source = peak_memory_bytes()
  mfu = (real / total * flops(mean_length) / (peak * jax.device_count())) if peak else None
  mfu_computed = (computed / total * flops(mean_width) / (peak * jax.device_count())
                  if peak else None)
  print(f"model: {num_params / 1e6:.1f}M parameters, {flops(mean_length) / 1e6:.0f} MFLOP "
        f"per target token (mean target length {mean_length:.1f})")
  print(f"train: {steps} steps of ~{cfg.train.batch_tokens} tokens per side in "
        f"{total:.2f} s (a step of each shape and {warmup_steps} warm-up steps "
        f"{timed['warmup_s']:.1f} s)")
  print(f"  step time median {timed['step_s'] * 1e3:.1f} ms (10th-90th percentile "
        f"{timed['step_s_p10'] * 1e3:.1f}-{timed['step_s_p90'] * 1e3:.1f} ms); "
        f"{real / total:,.0f} non-pad target tokens/s; real tokens "
        f"{100 * real / computed:.1f}% of computed positions; "
        f"{memory / 2**30:.2f} GiB {memory_source}")
  if peak:
    print(f"  MFU {100 * mfu:.1f}% on real tokens, {100 * mfu_computed:.1f}% on computed "
          f"positions, of {peak / 1e12:.2f} TFLOP/s per device, {peak_source}")
  else:
    print(f"  MFU: {peak_source}")
  return live["state"], {
      **timed, "num_params": num_params, "real_token_fraction": real / computed,
      "mfu": mfu, "mfu_computed": mfu_computed,
      "peak_tflops": peak / 1e12 if peak else None, "peak_source": peak_source,
      "peak_memory_gib": memory / 2**30, "peak_memory_source": memory_source}
