"""A training run wired once: `make_run` builds what the training loop, the benchmark
and the tests share (model, optimizer, sharded train state, jitted steps on the mesh)."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp

from transformer_jax import checkpoint, config as config_lib, partitioning
from transformer_jax.data import batching, parallel_data
from transformer_jax.model.transformer import Transformer
from transformer_jax.training import optimizer, step
from transformer_jax.training.step import TrainState


@dataclasses.dataclass(frozen=True)
class Run:
  """What a training run needs, wired once: `train_and_evaluate`, the benchmark and
  the tests all get it from `make_run`."""

  cfg: config_lib.Config  # With the vocabulary filled in.
  mesh: jax.sharding.Mesh
  model: Transformer
  schedule: optax.Schedule
  shardings: TrainState  # Of the train state.
  dropout_key: jax.Array
  train_step: Callable  # (state, batch, dropout_key) -> (state, TrainMetrics); jitted.
  eval_step: Callable  # (params, batch) -> EvalMetrics; jitted.

  @property
  def row_multiple(self) -> int:
    """Rows of every train batch are a multiple of this, with empty rows added, so that
    they split evenly over the data shards and then into microbatches."""
    return partitioning.data_shards(self.mesh) * self.cfg.train.grad_accum_steps

  def train_batch(self, data: parallel_data.ParallelData, step: int) -> dict[str, np.ndarray]:
    """Global batch `step` (0-based) on the host, the same on every process."""
    return batching.train_batch(data, step, self.cfg.train, self.cfg.data.max_length,
                                self.row_multiple)

  def train_batch_shapes(self, data: parallel_data.ParallelData) -> list[dict[str, tuple]]:
    return batching.train_batch_shapes(data, self.cfg.train, self.cfg.data.max_length,
                                       self.row_multiple)

  def activate(self) -> contextlib.AbstractContextManager:
    """The mesh and logical-axis rules the steps run under."""
    return partitioning.activate(self.mesh, self.cfg.train.logical_axis_rules)


def make_run(cfg: config_lib.Config, mesh: jax.sharding.Mesh,
             ckpt: ocp.CheckpointManager | None = None, abstract: bool = False
             ) -> tuple[Run, TrainState]:
  """The run's model, optimizer and jitted steps, and its train state: restored from
  `ckpt`'s latest checkpoint if it has one (a checkpoint.WithAverage where it holds the
  averaging window's sum: averaging.Window.resume splits it), else initialised from
  train.seed, straight into the shardings; with `abstract`, only its shapes, dtypes and
  shardings."""
  model = Transformer(cfg.model)
  tx, schedule = optimizer.make_optimizer(cfg.optimizer, cfg.model.d_model)
  init_key, dropout_key = jax.random.split(jax.random.key(cfg.train.seed))
  if cfg.train.rng_impl != "threefry":  # Another generator for dropout's bits.
    dropout_key = jax.random.key(cfg.train.seed, impl=cfg.train.rng_impl)
  rules = cfg.train.logical_axis_rules
  restore = ckpt is not None and ckpt.latest_step() is not None
  if abstract or restore:
    state = step.abstract_train_state(model, tx, mesh, rules)
    shardings = jax.tree.map(lambda x: x.sharding, state)
    if restore and not abstract:
      state = checkpoint.restore_state(ckpt, state)
  else:
    state, shardings = step.create_train_state(model, tx, mesh, init_key, rules,
                                               cfg.train.perturb_init_ulps)
  train_fn, eval_fn = step.jit_steps(model, cfg, mesh, shardings)
  return Run(cfg, mesh, model, schedule, shardings, dropout_key, train_fn, eval_fn), state


def eval_rows(cfg: config_lib.Config, mesh: jax.sharding.Mesh) -> int:
  """train.batch_size rounded up to split evenly over the data shards."""
  shards = partitioning.data_shards(mesh)
  return config_lib.round_up(cfg.train.batch_size, shards)
