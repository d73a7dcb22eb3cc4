"""Compile the train step ahead of time, without running it: the memory per device, and
on compile-only TPU slices or GPUs (planning/topology.py) whether it and the eval
step fit the chip's memory, with beam search for the widest sources it decodes, and on a TPU
the compiler's own estimate of a train step's time.

The estimate is the compiler's cost model (`cost_analysis()["optimal_seconds"]`), or where
that is missing or not positive, a roofline of the compiled program's FLOPs at the chip's
peak and its bytes at the HBM bandwidth; a model, not a measurement.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp

from transformer_jax import cli, config as config_lib, kernels, partitioning
from transformer_jax.data import batching
from transformer_jax.inference import translation
from transformer_jax.model import attention
from transformer_jax.model import beam_search as search
from transformer_jax.planning import roofline, topology
from transformer_jax.training import run as run_lib

GIB = 2**30


def compile_train_step(run: run_lib.Run, abstract_state) -> tuple[object, tuple[int, int], float]:
  """The compiled train step for the largest batch `train.batching` makes, whatever the
  data (rows rounded as the run rounds them); its (rows, width) and the seconds it took."""
  shapes = batching.largest_batch_shapes(run.cfg.train, run.cfg.data.max_length,
                                         run.row_multiple)
  batch = {k: jax.ShapeDtypeStruct(shape, jnp.int32,
                                   sharding=partitioning.batch_sharding(run.mesh))
           for k, shape in shapes.items()}
  key = jax.ShapeDtypeStruct((), run.dropout_key.dtype,
                             sharding=partitioning.replicated(run.mesh))
  start = time.perf_counter()
  with run.activate():
    compiled = run.train_step.lower(abstract_state, batch, key).compile()
  return compiled, shapes["inputs"], time.perf_counter() - start


def compile_eval_step(run: run_lib.Run, abstract_state):
  """The compiled eval step, for the held-out batches the run evaluates."""
  shape = (run_lib.eval_rows(run.cfg, run.mesh), run.cfg.data.max_length)
  batch = {k: jax.ShapeDtypeStruct(shape, jnp.int32,
                                   sharding=partitioning.batch_sharding(run.mesh))
           for k in ("inputs", "targets")}
  with run.activate():
    return run.eval_step.lower(abstract_state.params, batch).compile()


def compile_beam_search(run: run_lib.Run, abstract_state):
  """The compiled beam search (decode settings as configured) for the widest batch of
  sources the run may decode: model.max_len - decode.max_extra_length positions."""
  width = search.max_len(run.model) - run.cfg.decode.max_extra_length
  rows = translation.decode_rows(run.cfg.decode, width, partitioning.data_shards(run.mesh))
  inputs = jax.ShapeDtypeStruct((rows, width), jnp.int32,
                                sharding=partitioning.batch_sharding(run.mesh))
  with run.activate():
    return translation.decode_batch(abstract_state.params, inputs, run.model, run.cfg.decode,
                                    lower=True).compile()


def _total_bytes(compiled) -> int:
  memory = compiled.memory_analysis()
  return (memory.argument_size_in_bytes + memory.output_size_in_bytes -
          memory.alias_size_in_bytes + memory.temp_size_in_bytes +
          getattr(memory, "generated_code_size_in_bytes", 0))


def figures(compiled, batch: tuple[int, int], seconds: float,
            target: topology.Tpu | topology.Gpus | None = None) -> dict:
  """Memory per device (GiB); on a compile-only target whether it fits, and where the
  compiler gives a cost analysis (TPUs) FLOPs, bytes and the estimate."""
  memory = compiled.memory_analysis()
  code = getattr(memory, "generated_code_size_in_bytes", 0)
  total = _total_bytes(compiled)
  out = {"batch": list(batch), "compile_s": seconds,
         "arguments_gib": memory.argument_size_in_bytes / GIB,
         "outputs_gib": memory.output_size_in_bytes / GIB,
         "donated_gib": memory.alias_size_in_bytes / GIB,
         "temporaries_gib": memory.temp_size_in_bytes / GIB,
         "generated_code_gib": code / GIB, "total_gib": total / GIB}
  if target:
    out.update(accelerator_type=target.accelerator_type, chips=target.chips,
               hosts=target.hosts, hbm_gib=target.hbm_gib, fits=total <= target.hbm_gib * GIB)
    if isinstance(target, topology.Gpus):
      out["memory_fraction"] = topology.jax_memory_fraction()
  cost = compiled.cost_analysis() if target else None  # None from the CUDA plugin.
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  if cost:
    flops, bytes_accessed = cost.get("flops", 0.0), cost.get("bytes accessed", 0.0)
    said = cost.get("optimal_seconds")  # Not always given, nor always positive.
    roofline = max(flops / (target.peak_tflops * 1e12),
                   bytes_accessed / (target.hbm_gbps * 1e9))
    step_s = said if said and said > 0 else roofline
    out.update(flops_per_chip=flops, bytes_accessed_per_chip=bytes_accessed,
               compiler_step_s=said, roofline_step_s=roofline, estimated_step_s=step_s,
               estimate="compiler" if step_s == said else "roofline",
               estimated_target_positions_per_s=batch[0] * batch[1] / step_s,
               estimated_mfu=flops / step_s / (target.peak_tflops * 1e12))
  return out


def describe(f: dict) -> list[str]:
  """The report's lines."""
  if "compiler" in f:  # The compiler refused: out of memory.
    return [f"{f['accelerator_type']}: does not fit {f['hbm_gib']:.0f} GiB of HBM a chip "
            f"(the compiler: {f['compiler']})"]
  rows, width = f["batch"]
  lines = [f"compiled in {f['compile_s']:.1f} s for a batch of {rows} x {width} (the longest)",
           f"memory per device: arguments {f['arguments_gib']:.2f} GiB, outputs "
           f"{f['outputs_gib']:.2f} GiB (donated {f['donated_gib']:.2f}), temporaries "
           f"{f['temporaries_gib']:.2f} GiB, generated code {f['generated_code_gib']:.3f} "
           f"GiB; total {f['total_gib']:.2f} GiB"]
  if "fits" in f:
    lines.append(f"{f['accelerator_type']} ({f['chips']} chips, {f['hosts']} host(s)): "
                 f"{f['total_gib']:.2f} (the eval step {f.get('eval_total_gib', 0):.2f}, "
                 f"beam search {f.get('beam_search_total_gib', 0):.2f}) "
                 f"of {f['hbm_gib']:.0f} GiB HBM per chip"
                 + (f" (JAX's share, {f['memory_fraction']:.0%})"
                    if "memory_fraction" in f else "")
                 + (": fits" if f["fits"] else ": does not fit"))
  if "compiler_step_s" in f:
    said = f["compiler_step_s"]
    lines += [
        f"per chip a step: {f['flops_per_chip'] / 1e12:.3f} TFLOP, "
        f"{f['bytes_accessed_per_chip'] / 1e9:.2f} GB accessed; roofline (those FLOPs at "
        f"the chip's peak, those bytes at its HBM bandwidth) {f['roofline_step_s'] * 1e3:.1f} "
        "ms; the TPU compiler's estimate " + (f"{said * 1e3:.1f} ms" if f["estimate"] ==
                                              "compiler" else f"unusable ({said})"),
        f"estimated ({f['estimate']}; a cost model, not a measurement): "
        f"{f['estimated_step_s'] * 1e3:.1f} ms a step, "
        f"{f['estimated_target_positions_per_s']:,.0f} target positions/s, "
        f"MFU {100 * f['estimated_mfu']:.1f}%"]
  if "roofline" in f:
    rows, width = f["roofline"]["batch"]
    xla = f["roofline"].get("xla_attention_step_ms")
    lines += [f"where a step of {rows} x {width} goes, by its compiled program with "
              + ("cuDNN's attention, as compiled:" if xla is None else
                 f"cuDNN's attention estimated (XLA's, as compiled here: {xla:.2f} ms):"),
              *roofline.describe(f["roofline"])]
  return lines


def check(cfg: config_lib.Config, mesh,
          target: topology.Tpu | topology.Gpus | None = None) -> dict:
  """`figures` of `cfg`'s train step compiled for `mesh` (of `target`'s devices, if
  given); when the TPU compiler finds it too large for the chip, what it said."""
  try:
    run, state = run_lib.make_run(cfg, mesh, abstract=True)
    compiled, batch, seconds = compile_train_step(run, state)
    if target:
      evaluation = _total_bytes(compile_eval_step(run, state))
      beam = _total_bytes(compile_beam_search(run, state))
  except jax.errors.JaxRuntimeError as e:
    if target is None or "RESOURCE_EXHAUSTED" not in str(e):
      raise
    said = str(e).strip().splitlines()[0].rstrip(".")
    if "Shared memory" in said:  # A Pallas kernel's tiles, not the HBM.
      chosen = ", ".join(f"{option}={value!r}"
                         for option, value in kernels.option_values(cfg).items())
      raise config_lib.InputError(
          f"{said}: a Pallas kernel's tiles ({chosen}) do not fit "
          f"{target.accelerator_type}'s shared memory a block; 'xla' has no such "
          "kernel.") from None
    return {"accelerator_type": target.accelerator_type, "hbm_gib": target.hbm_gib,
            "fits": False, "compiler": said, "mesh": dict(mesh.shape)}
  except RuntimeError as e:  # An attention implementation's library, not installed?
    missing = attention.implementation(cfg.model).missing_library(
        e, target.accelerator_type if target else "")
    if missing is None:
      raise
    raise config_lib.InputError(missing) from None
  out = {**figures(compiled, batch, seconds, target), "mesh": dict(mesh.shape),
         "train_steps": cfg.train.num_train_steps}
  if isinstance(target, topology.Gpus) and target.chips == 1:  # Where a step's time goes.
    out["roofline"] = roofline.for_gpu(compiled.as_text(), cfg.model, batch, target.model,
                                       target.peak_tflops, target.hbm_gbps)
  if target:  # Evaluation must fit too (its parameters are the train step's).
    out.update(eval_total_gib=evaluation / GIB, beam_search_total_gib=beam / GIB,
               fits=out["fits"] and max(evaluation, beam) <= target.hbm_gib * GIB)
  return out


def fit(cfg: config_lib.Config, target: topology.Tpu | topology.Gpus,
        num_slices: int = 1) -> dict:
  """`check` on `num_slices` compile-only slices (or GPU systems) of `target`, with cfg's
  mesh."""
  devices = target.devices(num_slices)
  return check(cfg, partitioning.make_mesh(cfg.train.mesh_shape, devices), target)


def alternatives(cfg: config_lib.Config) -> list[tuple[str, config_lib.Config]]:
  """The obvious ways to need less memory a chip: parameters and Adam state sharded
  (FSDP), then the batch in 2 or 4 times the microbatches; as (flag, config)."""
  train = cfg.train
  out = []
  if tuple(train.mesh_shape) != (1, -1, 1):
    out.append(("--config.train.mesh_shape=(1,-1,1)",
                dataclasses.replace(train, mesh_shape=(1, -1, 1))))
  for k in (2, 4):
    out.append((f"--config.train.grad_accum_steps={train.grad_accum_steps * k}",
                dataclasses.replace(train, grad_accum_steps=train.grad_accum_steps * k)))
  return [(flag, dataclasses.replace(cfg, train=t)) for flag, t in out]


def suggest(cfg: config_lib.Config, target: topology.Tpu | topology.Gpus,
            num_slices: int = 1) -> str | None:
  """The first of `alternatives` that fits, as a flag, or None."""
  for flag, alternative in alternatives(cfg):
    if fit(alternative, target, num_slices)["fits"]:
      return flag
  return None


def refusal(f: dict, suggestion: str | None) -> str:
  """One line: why a config does not fit, and what would."""
  why = (f"{f['total_gib']:.2f} GiB a chip" if "total_gib" in f else f["compiler"])
  return (f"does not fit {f['accelerator_type']} ({f['hbm_gib']:.0f} GiB of HBM a chip): "
          f"{why}; " + (f"{suggestion} fits" if suggestion else
                        "nor with FSDP or 2-4x the microbatches"))


def report(cfg: config_lib.Config, mesh, target: topology.Tpu | topology.Gpus | None,
           num_slices: int = 1) -> dict:
  """`check`'s figures, printed (`benchmark --aot` and `--topology`); exit 2 with one
  line where the config does not fit (naming what would) or the target has no kernel
  for one of its options."""
  try:
    figures = check(cfg, mesh, target)
  except config_lib.InputError as e:
    cli.fail(str(e))
  print("\n".join(describe(figures)))
  if figures.get("fits") is False:
    cli.fail(refusal(figures, suggest(cfg, target, num_slices)))
  return figures
