"""Where a Pallas kernel runs: interpreted on a CPU, compiled for a GPU, and on each
device's rows of a sharded batch."""

from __future__ import annotations

from typing import Callable, Sequence

import jax
from jax.sharding import PartitionSpec as P


def interpret() -> bool:
  """Whether a kernel traced here runs in Pallas's interpreter: where the current
  mesh's devices (or, outside a mesh, the default backend) are CPUs. A mesh of
  compile-only GPUs (benchmark --topology) gets the Triton kernels."""
  mesh = jax.sharding.get_abstract_mesh()
  device = None if mesh.empty else mesh.abstract_device
  return (device.platform if device else jax.default_backend()) == "cpu"


def on_row_shards(f: Callable, rows_in: Sequence[bool], rows_out: bool,
                  axes: tuple[str, ...]) -> Callable:
  """f run by each device on its rows (split over the mesh axes `axes`), the other
  operands whole: XLA does not partition a Pallas kernel. rows_in: which operands have
  rows; rows_out: whether the result has (else it is the same on every device). Outside
  a mesh, f. Without check_vma (Pallas's interpreter fails it): shard_map's transpose
  divides a replicated result's cotangent among the devices and sums the gradients of
  whole operands over them, which gives each its gradient once."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return f
  spec = lambda rows: P(axes) if rows else P()
  return jax.shard_map(f, mesh=mesh, in_specs=tuple(map(spec, rows_in)),
                       out_specs=spec(rows_out), check_vma=False)
