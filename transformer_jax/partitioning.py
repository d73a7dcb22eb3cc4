"""Device mesh and the table that maps logical axis names onto it.

The mesh has axes (data, fsdp, tensor). Model parameters and activations carry logical
names (see model/transformer.py); the rules table (train.logical_axis_rules, default
config.DEFAULT_LOGICAL_AXIS_RULES) decides where each lands, so data parallelism, FSDP
and tensor parallelism are chosen by mesh shape and rules alone, never by model code.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from transformer_jax.config import DEFAULT_LOGICAL_AXIS_RULES, InputError, MESH_AXES

BATCH_AXES = MESH_AXES[:2]  # (data, fsdp): the global batch is split over both.


def make_mesh(shape: Sequence[int], devices: Sequence[jax.Device] | None = None) -> Mesh:
  """Mesh of `shape` over (data, fsdp, tensor); one -1 entry takes the remaining devices."""
  devices = list(jax.devices() if devices is None else devices)
  shape = list(shape)
  if len(shape) != len(MESH_AXES):
    raise InputError(f"train.mesh_shape={tuple(shape)} must have {len(MESH_AXES)} entries "
                     f"for axes {MESH_AXES}.")
  if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
    raise InputError(f"train.mesh_shape={tuple(shape)}: entries must be positive, with at most "
                     "one -1.")
  if -1 in shape:
    known = math.prod(s for s in shape if s != -1)
    if len(devices) % known:
      raise InputError(f"train.mesh_shape={tuple(shape)} does not divide {len(devices)} devices.")
    shape[shape.index(-1)] = len(devices) // known
  if math.prod(shape) != len(devices):
    raise InputError(f"train.mesh_shape={tuple(shape)} needs {math.prod(shape)} devices; "
                     f"{len(devices)} are available.")
  # Auto axes: XLA propagates shardings from the constraints (pjit style).
  return jax.make_mesh(tuple(shape), MESH_AXES, devices=devices,
                       axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES))


@contextlib.contextmanager
def activate(mesh: Mesh, rules: Sequence[tuple[str, Any]] = DEFAULT_LOGICAL_AXIS_RULES):
  """Makes `mesh` and `rules` current, so activation constraints take effect."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    yield


def logical_shardings(boxed_tree: Any, mesh: Mesh,
                      rules: Sequence[tuple[str, Any]] = DEFAULT_LOGICAL_AXIS_RULES) -> Any:
  """NamedShardings for a tree whose leaves carry logical names (nn.LogicallyPartitioned)."""
  specs = nn.get_partition_spec(boxed_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, rules)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """[batch, length] arrays: rows split over the data-parallel axes."""
  return NamedSharding(mesh, P(BATCH_AXES))


def data_shards(mesh: Mesh) -> int:
  """How many ways the batch's rows are split."""
  return math.prod(mesh.shape[axis] for axis in BATCH_AXES)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def local_rows(batch: dict[str, np.ndarray], process_index: int,
               process_count: int) -> dict[str, np.ndarray]:
  """Process `process_index`'s disjoint share of the rows of a global batch."""
  rows = next(iter(batch.values())).shape[0]
  if rows % process_count:
    raise ValueError(f"A batch of {rows} rows does not split over {process_count} "
                     "processes.")
  share = rows // process_count
  return {k: v[process_index * share:(process_index + 1) * share] for k, v in batch.items()}


def shard_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Places a global batch, which every process holds whole, onto the mesh as global
  arrays: each process hands over its own share of the rows (`local_rows`)."""
  sharding = batch_sharding(mesh)
  local = local_rows(batch, jax.process_index(), jax.process_count())
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local.items()}
