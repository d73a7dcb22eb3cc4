"""Where a Pallas kernel runs: interpreted on a CPU or compiled for a GPU (with Triton's
parameters, `triton_params`), and on each device's rows of a sharded batch."""

from __future__ import annotations

from typing import Callable, Sequence

import flax.linen as nn
import jax
from jax.sharding import PartitionSpec as P


def platform() -> str:
  """Where a kernel traced here runs: the current mesh's devices' platform ("cpu",
  "gpu", "tpu"), or outside a mesh the default backend's. A mesh of compile-only GPUs
  or TPUs (benchmark --topology) gets that platform's kernels."""
  mesh = jax.sharding.get_abstract_mesh()
  device = None if mesh.empty else mesh.abstract_device
  return device.platform if device else jax.default_backend()


def interpret() -> bool:
  """Whether a kernel traced here runs in Pallas's interpreter: on a CPU."""
  return platform() == "cpu"


def row_axes() -> tuple[str, ...]:
  """The mesh axes the rows of a batch are split over: activation_batch's, by the
  current logical axis rules (train.logical_axis_rules)."""
  axes = nn.logical_to_mesh_axes(("activation_batch",))[0] or ()
  return (axes,) if isinstance(axes, str) else tuple(axes)


def on_row_shards(f: Callable, rows_in: Sequence[bool], rows_out: bool) -> Callable:
  """f run by each device on its rows (split over row_axes()), the other operands
  whole: XLA does not partition a Pallas kernel. rows_in: which operands have rows;
  rows_out: whether the result has (else it is the same on every device). Outside a
  mesh, f. Without check_vma (Pallas's interpreter fails it): shard_map's transpose
  divides a replicated result's cotangent among the devices and sums the gradients of
  whole operands over them, which gives each its gradient once."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return f
  axes = row_axes()
  spec = lambda rows: P(axes) if rows else P()
  return jax.shard_map(f, mesh=mesh, in_specs=tuple(map(spec, rows_in)),
                       out_specs=spec(rows_out), check_vma=False)


def triton_params(interpret, **triton):
  """Triton's compiler parameters for a GPU kernel (this project's GPU kernels are
  Pallas on Triton; its TPU kernels, on Mosaic, give theirs themselves); none where
  `interpret` is not a bool but an interpreter's parameters (pltpu.InterpretParams:
  JAX's checking interpreter, which raises on a read outside a program's block where
  interpret=True clamps it, as a GPU does not; the tests run the kernels under it)."""
  from jax.experimental.pallas import triton as plgpu
  return plgpu.CompilerParams(**triton) if isinstance(interpret, bool) else None
