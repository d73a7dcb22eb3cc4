"""A training run wired once: `make_run` builds what the training loop, the benchmark
and the tests share (model, optimizer, sharded train state, jitted steps on the mesh);
before it, what the loop checks and loads to build it (`preflight`, `load_task`,
`with_task`), and after it, what the run's log says of it (`log_start`)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from typing import Callable, Iterable, Iterator

import jax
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp

from transformer_jax import checkpoint, config as config_lib, partitioning
from transformer_jax.data import batching, corpora, parallel_data, tasks
from transformer_jax.model import attention
from transformer_jax.model.transformer import Transformer
from transformer_jax.training import optimizer, run_ahead, step
from transformer_jax.training.step import TrainState


def preflight(config: ml_collections.ConfigDict, workdir: str
              ) -> tuple[config_lib.Config, jax.sharding.Mesh, list[str]]:
  """Everything checkable before data is loaded or anything is written or compiled: the
  config, the mesh against the devices, a resumed workdir's config, and the data files
  or TFDS dataset, resolved here once for the whole run (`corpora.corpus`). Raises
  InputError."""
  cfg = config_lib.parse(config)
  mesh = partitioning.make_mesh(cfg.train.mesh_shape)
  changes = checkpoint.check_resume(cfg, workdir)  # Against the config as written.
  corpus = corpora.corpus(cfg.data)
  corpus.check_available()
  cfg = dataclasses.replace(cfg, data=corpus.cfg)
  return cfg, mesh, changes


def load_task(cfg: config_lib.Config, workdir: str) -> tasks.Task:
  """The run's data and tokenizer (tasks.load_task); a problem in the data itself (its
  file and line) is an InputError, as a config's is."""
  try:
    return tasks.load_task(cfg.data, workdir)
  except config_lib.InputError:  # Named already (NotPrepared among them).
    raise
  except ValueError as e:
    raise config_lib.InputError(str(e)) from e


def with_task(cfg: config_lib.Config, task: tasks.Task) -> config_lib.Config:
  """`cfg` with the tokenizer's vocabulary, and its epoch cadences in steps."""
  cfg = config_lib.with_vocab(cfg, task.tokenizer.vocab_size)
  if cfg.train.eval_every_epochs or cfg.train.checkpoint_every_epochs:
    epoch = batching.steps_per_epoch(task.train, cfg.train)
    cfg = config_lib.with_epochs(cfg, epoch)
    logging.info("an epoch is %d steps: the held-out loss every %d steps, a checkpoint "
                 "every %d", epoch, cfg.train.eval_every_steps,
                 cfg.train.checkpoint_every_steps)
  return cfg


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

  def device_batch(self, data: parallel_data.ParallelData, step: int
                   ) -> tuple[dict[str, jax.Array], dict[str, float]]:
    """Train batch `step` on the mesh, and how full its rows are (host floats)."""
    batch = self.train_batch(data, step)
    fill = {f"train/{k}_fill": float(np.mean(batch[k] != 0)) for k in ("inputs", "targets")}
    return partitioning.shard_batch(batch, self.mesh), fill

  def device_batches(self, data: parallel_data.ParallelData, steps: Iterable[int]
                     ) -> Iterator[tuple[dict[str, jax.Array], dict[str, float]]]:
    """`device_batch` of each of `steps`, built train.prefetch steps ahead in a thread
    (run_ahead.prefetch; 0: as the loop asks). Close it to end the thread."""
    produce = functools.partial(self.device_batch, data)
    if self.cfg.train.prefetch:
      return run_ahead.prefetch(produce, steps, self.cfg.train.prefetch)
    return (produce(step) for step in steps)

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


def log_start(run: Run, state: TrainState, task: tasks.Task) -> None:
  """Where the run starts, its model and mesh, and how its batches are laid out."""
  cfg, mesh = run.cfg, run.mesh
  if int(state.step):
    logging.info("resumed from checkpoint at step %d", int(state.step))
  if cfg.train.average_last > cfg.train.keep_checkpoints:
    logging.warning("train.average_last=%d, but train.keep_checkpoints=%d: the final "
                    "evaluation averages %d snapshots (summed as it trains), but "
                    "`evaluate --average_last` finds only the %d kept",
                    cfg.train.average_last, cfg.train.keep_checkpoints,
                    cfg.train.average_last, cfg.train.keep_checkpoints)
  logging.info("model: %.2fM parameters; mesh %s",
               sum(x.size for x in jax.tree.leaves(state.params)) / 1e6, dict(mesh.shape))
  shapes = sorted({shape["targets"] for shape in run.train_batch_shapes(task.train)})
  source, target = batching.real_tokens_per_batch(task.train, cfg.train, cfg.data.max_length)
  size = (f"train.batch_tokens={cfg.train.batch_tokens} counted as "
          f"{cfg.train.batch_tokens_count!r}" if cfg.train.batching == "tokens"
          else f"train.batch_size={cfg.train.batch_size}")
  if cfg.train.batching == "tokens" and (alone := batching.over_budget(task.train,
                                                                      cfg.train.batch_tokens)):
    logging.warning("train.batch_tokens=%d is below the length of %d training pairs (the "
                    "longest: %d tokens): each of them is a batch of one pair, over the "
                    "budget. Raise train.batch_tokens, or lower data.max_length",
                    cfg.train.batch_tokens, alone, int(task.train.longer_side().max()))
  logging.info("batches (train.batching=%r, %s): %s real source and %s real target "
               "tokens a batch on average, as rows x length %s; %d microbatch(es) a step, "
               "%d data shard(s), %d device(s)", cfg.train.batching, size,
               f"{source:,.0f}", f"{target:,.0f}", ", ".join(f"{r}x{n}" for r, n in shapes),
               cfg.train.grad_accum_steps, partitioning.data_shards(mesh), mesh.size)
  if (packed_rows := attention.implementation(cfg.model).packed_rows) and \
      cfg.train.batching == "packed":
    logging.info("attention: %s", packed_rows)
  most, fraction = batching.empty_rows_added(task.train, cfg.train, cfg.data.max_length,
                                             run.row_multiple)
  if most:
    logging.info("batches split over %d data shards x %d microbatches: up to %d empty "
                 "rows added to a batch (%.1f%% of rows); the examples do not depend on it",
                 partitioning.data_shards(mesh), cfg.train.grad_accum_steps, most,
                 100 * fraction)
