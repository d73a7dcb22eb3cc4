"""Training and evaluation.

`make_run` wires a run once (model, optimizer, sharded train state, jitted steps on the
mesh) for the training loop, the benchmark and the tests. `train_and_evaluate(config,
workdir)` is the one hand-off from the command line to the library; it reads top to
bottom in phases: config, data, the run (restored if the workdir has a checkpoint),
compiled programs, the loop with its cadences (log, evaluate, BLEU, checkpoint, stop on
a signal), and the final evaluation.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import datetime
import functools
import json
import logging
import os
import queue
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
from clu import parameter_overview
from etils import epath
from flax.training import train_state

from transformer_jax import attention, batching, bleu, checkpoint, config as config_lib
from transformer_jax import corpora, files, inference, losses, optimizer, partitioning
from transformer_jax import preemption, summaries, tasks, watchdog
from transformer_jax.model import Transformer

TrainState = train_state.TrainState
T = TypeVar("T")


# --- Sharded state ---------------------------------------------------------------------

def _init_fn(model: Transformer, tx: optax.GradientTransformation):
  def init(rng):  # Parameters (and so Adam's moments) carry logical axis names.
    return TrainState.create(apply_fn=model.apply, params=inference.init_params(model, rng),
                             tx=tx)
  return init


def create_train_state(model: Transformer, tx: optax.GradientTransformation,
                       mesh: jax.sharding.Mesh, rng: jax.Array,
                       rules=config_lib.DEFAULT_LOGICAL_AXIS_RULES) -> tuple[TrainState, TrainState]:
  """Initialises the state directly into its shardings (no full copy on one host).

  Returns (state, shardings), both TrainState-shaped.
  """
  init = _init_fn(model, tx)
  shardings = partitioning.logical_shardings(jax.eval_shape(init, rng), mesh, rules)
  # Traced outside `partitioning.activate`: out_shardings place the result, and Flax
  # would check each kernel's initialiser against the active mesh while tracing.
  state = jax.jit(lambda r: nn.meta.unbox(init(r)), out_shardings=shardings)(rng)
  return state, shardings


def abstract_train_state(model: Transformer, tx: optax.GradientTransformation,
                         mesh: jax.sharding.Mesh, rules) -> TrainState:
  """The train state's shapes, dtypes and shardings, allocating nothing."""
  boxed = jax.eval_shape(_init_fn(model, tx), jax.random.key(0))
  return checkpoint.abstract_with_shardings(
      nn.meta.unbox(boxed), partitioning.logical_shardings(boxed, mesh, rules))


# --- Steps -----------------------------------------------------------------------------

def metric_sums(model: Transformer, params: Any, batch: dict[str, jax.Array],
                label_smoothing: float, loss_chunk_length: int = 0,
                dropout_rng: jax.Array | None = None) -> dict[str, jax.Array]:
  """losses.token_metrics of the model on `batch`, with dropout when given its key; with
  `loss_chunk_length`, chunked so that no [tokens, vocab] array exists."""
  kwargs = dict(deterministic=dropout_rng is None,
                rngs=None if dropout_rng is None else {"dropout": dropout_rng})
  if not loss_chunk_length:
    logits = model.apply({"params": params}, **batch, **kwargs)
    return losses.token_metrics(logits, batch["targets"], label_smoothing)
  states = model.apply({"params": params}, **batch, project=False, **kwargs)
  project = lambda y: model.apply({"params": params}, y, method=Transformer.project)
  return losses.chunked_token_metrics(project, states, batch["targets"], label_smoothing,
                                      loss_chunk_length)


def train_step(state: TrainState, batch: dict[str, jax.Array], dropout_key: jax.Array, *,
               model: Transformer, label_smoothing: float, grad_accum_steps: int = 1,
               loss_chunk_length: int = 0, inject_nonfinite_at: tuple[int, ...] = ()
               ) -> tuple[TrainState, dict[str, jax.Array]]:
  """One Adam update on the mean label-smoothed loss over the batch's real tokens.

  With grad_accum_steps = k, the batch is split into k microbatches of strided rows
  (each device keeps an equal share of each); their gradient sums add up to the whole
  batch's, so the update equals one on the full batch.

  A step whose loss or gradient norm is not finite leaves the parameters and Adam's
  moments as they were (on device, no host sync); it counts the step, reports
  `nonfinite` = 1 and zero metrics. `inject_nonfinite_at` (1-based steps) makes the loss
  NaN there, to test this.
  """
  rng = jax.random.fold_in(dropout_key, state.step)
  poison = jnp.where(jnp.isin(state.step + 1, jnp.asarray(inject_nonfinite_at, jnp.int32)),
                     jnp.nan, 1.0) if inject_nonfinite_at else 1.0

  def grads_and_sums(microbatch, rng):
    def summed_loss(params):
      sums = metric_sums(model, params, microbatch, label_smoothing, loss_chunk_length, rng)
      sums["loss"] = sums["loss"] * poison
      return sums["loss"], sums
    return jax.grad(summed_loss, has_aux=True)(state.params)

  if grad_accum_steps == 1:
    grads, sums = grads_and_sums(batch, rng)
  else:
    k = grad_accum_steps
    micro = jax.tree.map(lambda x: nn.with_logical_constraint(
        x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1),
        (None, "activation_batch", "activation_length")), batch)  # [k, rows / k, len]
    def add_microbatch(total, inputs):
      i, microbatch = inputs
      new = grads_and_sums(microbatch, jax.random.fold_in(rng, i))
      return jax.tree.map(jnp.add, total, new), None
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(
        grads_and_sums, jax.tree.map(lambda x: x[0], micro), rng))
    (grads, sums), _ = jax.lax.scan(add_microbatch, zeros, (jnp.arange(k), micro))
  grads = jax.tree.map(lambda g: g / jnp.maximum(sums["tokens"], 1.0), grads)
  sums["grad_norm"] = optax.tree.norm(grads)
  finite = jnp.isfinite(sums["loss"]) & jnp.isfinite(sums["grad_norm"])
  new = state.apply_gradients(grads=grads)
  keep_if_not_finite = lambda new, old: jnp.where(finite, new, old)
  new = new.replace(params=jax.tree.map(keep_if_not_finite, new.params, state.params),
                    opt_state=jax.tree.map(keep_if_not_finite, new.opt_state, state.opt_state))
  sums = jax.tree.map(lambda x: jnp.where(finite, x, 0.0), sums)
  sums["nonfinite"] = 1 - finite.astype(jnp.int32)
  return new, sums


def eval_step(params: Any, batch: dict[str, jax.Array], *, model: Transformer,
              label_smoothing: float, loss_chunk_length: int = 0) -> dict[str, jax.Array]:
  return metric_sums(model, params, batch, label_smoothing, loss_chunk_length)


def jit_steps(model: Transformer, cfg: config_lib.Config, mesh: jax.sharding.Mesh,
              state_shardings: TrainState):
  """The train and eval steps, jitted with explicit shardings (state donated). XLA
  compiles each once per batch shape, on first use."""
  batch_sh = partitioning.batch_sharding(mesh)
  replicated = partitioning.replicated(mesh)
  train = jax.jit(
      functools.partial(train_step, model=model, label_smoothing=cfg.train.label_smoothing,
                        grad_accum_steps=cfg.train.grad_accum_steps,
                        loss_chunk_length=cfg.train.loss_chunk_length,
                        inject_nonfinite_at=cfg.train.inject_nonfinite_at),
      in_shardings=(state_shardings, batch_sh, replicated),
      out_shardings=(state_shardings, replicated), donate_argnums=0)
  evaluate = jax.jit(
      functools.partial(eval_step, model=model, label_smoothing=cfg.train.label_smoothing,
                        loss_chunk_length=cfg.train.loss_chunk_length),
      in_shardings=(state_shardings.params, batch_sh), out_shardings=replicated)
  return train, evaluate


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
  train_step: Callable  # (state, batch, dropout_key) -> (state, metric sums); jitted.
  eval_step: Callable  # (params, batch) -> metric sums; jitted.

  @property
  def row_multiple(self) -> int:
    """Rows of every train batch are a multiple of this, with empty rows added, so that
    they split evenly over the data shards and then into microbatches."""
    return partitioning.data_shards(self.mesh) * self.cfg.train.grad_accum_steps

  def train_batch(self, data: batching.ParallelData, step: int) -> dict[str, np.ndarray]:
    """Global batch `step` (0-based) on the host, the same on every process."""
    return batching.train_batch(data, step, self.cfg.train, self.cfg.data.max_length,
                                self.row_multiple)

  def train_batch_shapes(self, data: batching.ParallelData) -> list[dict[str, tuple]]:
    return batching.train_batch_shapes(data, self.cfg.train, self.cfg.data.max_length,
                                       self.row_multiple)

  def activate(self) -> contextlib.AbstractContextManager:
    """The mesh and logical-axis rules the steps run under."""
    return partitioning.activate(self.mesh, self.cfg.train.logical_axis_rules)


def make_run(cfg: config_lib.Config, mesh: jax.sharding.Mesh,
             ckpt: ocp.CheckpointManager | None = None, abstract: bool = False
             ) -> tuple[Run, TrainState]:
  """The run's model, optimizer and jitted steps, and its train state: restored from
  `ckpt`'s latest checkpoint if it has one, else initialised from train.seed, straight
  into the shardings; with `abstract`, only its shapes, dtypes and shardings."""
  model = Transformer(cfg.model)
  tx, schedule = optimizer.make_optimizer(cfg.optimizer, cfg.model.d_model)
  init_key, dropout_key = jax.random.split(jax.random.key(cfg.train.seed))
  if cfg.train.rng_impl != "threefry":  # Another generator for dropout's bits.
    dropout_key = jax.random.key(cfg.train.seed, impl=cfg.train.rng_impl)
  rules = cfg.train.logical_axis_rules
  restore = ckpt is not None and ckpt.latest_step() is not None
  if abstract or restore:
    state = abstract_train_state(model, tx, mesh, rules)
    shardings = jax.tree.map(lambda x: x.sharding, state)
    if restore and not abstract:
      state = checkpoint.restore_state(ckpt, state)
  else:
    state, shardings = create_train_state(model, tx, mesh, init_key, rules)
  train_fn, eval_fn = jit_steps(model, cfg, mesh, shardings)
  return Run(cfg, mesh, model, schedule, shardings, dropout_key, train_fn, eval_fn), state


def compile_ahead(lowerings: Sequence[Callable[[], Any]]) -> None:
  """Compiles the programs that the `lowerings` return, on parallel threads (XLA
  compiles outside the GIL); later calls with the same shapes reuse the executables."""
  threads = min(len(lowerings), os.cpu_count() or 1, 8)  # Each compile holds memory.
  with concurrent.futures.ThreadPoolExecutor(threads) as pool:
    list(pool.map(lambda lower: lower().compile(), lowerings))


def programs_to_compile(run: Run, task: tasks.Task, state: TrainState
                        ) -> list[Callable[[], Any]]:
  """Lowerings of every program the run will use: the train step for each batch shape
  the data can produce, the eval step, and beam search for each held-out batch shape.

  They lower with the real state, key and all-padding batches, exactly as the loop
  calls them, so the loop's calls find the compiled executables in jit's cache.
  """
  cfg = run.cfg
  def lowering(fn, *args, **kwargs):
    def lower():
      with run.activate():
        return fn(*args, **kwargs)
    return lower

  def padding(shapes):  # An all-padding global batch.
    return partitioning.shard_batch(
        {k: np.zeros(shape, np.int32) for k, shape in shapes.items()}, run.mesh)

  programs = [lowering(run.train_step.lower, state, padding(shapes), run.dropout_key)
              for shapes in run.train_batch_shapes(task.train)]
  eval_shape = (_eval_rows(cfg, run.mesh), cfg.data.max_length)
  programs.append(lowering(run.eval_step.lower, state.params,
                           padding({"inputs": eval_shape, "targets": eval_shape})))
  decode_mesh = inference.params_mesh(state.params)
  for shape in sorted(inference.decode_input_shapes(
      task.tokenizer.encode(task.eval_sources), cfg.model.max_len, cfg.decode,
      decode_mesh)):
    sources = inference.place_sources(np.zeros(shape, np.int32), decode_mesh)
    programs.append(lowering(inference.decode_batch, state.params, sources, run.model,
                             cfg.decode, lower=True))
  return programs


@contextlib.contextmanager
def count_compiles() -> Iterator[list[float]]:
  """Collects the seconds of every XLA compilation inside the block (also counted when
  JAX's persistent compilation cache, JAX_COMPILATION_CACHE_DIR, supplies the program)."""
  seconds = []
  def listener(event, duration, **_):
    if event == "/jax/core/compile/backend_compile_duration":
      seconds.append(duration)
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    yield seconds
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)


# --- Evaluation ------------------------------------------------------------------------

def _eval_rows(cfg: config_lib.Config, mesh: jax.sharding.Mesh) -> int:
  """train.batch_size rounded up to split evenly over the data shards."""
  shards = partitioning.data_shards(mesh)
  return -(-cfg.train.batch_size // shards) * shards


def evaluate_loss(run: Run, params, data: batching.ParallelData) -> dict[str, float]:
  """Loss metrics over the first train.num_eval_batches batches of held-out pairs."""
  cfg, sums = run.cfg, None
  rows = _eval_rows(cfg, run.mesh)
  for i, batch in enumerate(batching.eval_batches(data, rows, cfg.data.max_length)):
    if i >= cfg.train.num_eval_batches:
      break
    sums = _accumulate(sums, run.eval_step(params, partitioning.shard_batch(batch, run.mesh)))
  return losses.summarize(sums)


def evaluate_translation(params, model, task, cfg, workdir, step, writer) -> dict[str, Any]:
  start = time.time()
  scores = inference.translate_and_score(
      params, model, task.tokenizer, task.eval_sources, task.eval_references, cfg.decode,
      cfg.data.target_lang, epath.Path(workdir) / "translations" / f"step_{step}.txt")
  writer.write_scalars(step, {f"eval/{k}": scores[k] for k in bleu.SCORES})
  logging.info("step %d: sacreBLEU %.2f (paper-style %.2f), exact match %.1f%% on %d "
               "held-out pairs (%.0f s) [%s]", step, scores["bleu"], scores["paper_bleu"],
               100 * scores["exact_match"], len(scores["hypotheses"]), time.time() - start,
               scores["signature"])
  return scores


# --- The run ---------------------------------------------------------------------------

class NonFiniteError(RuntimeError):
  """Training stopped on non-finite losses or gradients (per train.on_nonfinite)."""


Preempted = preemption.Preempted


def preflight(config: ml_collections.ConfigDict, workdir: str
              ) -> tuple[config_lib.Config, jax.sharding.Mesh, list[str]]:
  """Everything checkable before data is loaded or anything is written or compiled: the
  config, the mesh against the devices, the data files or TFDS dataset, and a resumed
  workdir's config. Raises InputError."""
  cfg = config_lib.parse(config)
  mesh = partitioning.make_mesh(cfg.train.mesh_shape)
  corpora.check_available(cfg.data)
  return cfg, mesh, checkpoint.check_resume(cfg, workdir)


def _save_config(config: ml_collections.ConfigDict, workdir: str, writer,
                 changes: Sequence[str], step: int | None) -> None:
  if changes:  # Recorded: which fields a resumed run changed, and from which step.
    logging.info("resuming with changed settings: %s", "; ".join(changes))
    files.append_line(epath.Path(workdir) / "config_changes.jsonl",
                      json.dumps({"from_step": step, "changes": list(changes)}))
  files.write_atomic(epath.Path(workdir) / "config.json",
                     config.to_json_best_effort(indent=2, sort_keys=True))
  flat = {}
  def walk(prefix, node):
    for k, v in node.items():
      if isinstance(v, (dict, ml_collections.ConfigDict)):
        walk(f"{prefix}{k}.", v)
      else:
        flat[prefix + k] = v if isinstance(v, (int, float, str, bool)) else str(v)
  walk("", config)
  writer.write_hparams(flat)


def _accumulate(total, new):
  return new if total is None else jax.tree.map(jnp.add, total, new)


def _due(step: int, every: int, last: int) -> bool:
  """A cadence of `every` steps (0: never) that always includes the last step."""
  return step == last or (every > 0 and step % every == 0)


class TrainWindow:
  """The steps since the last log line: sums their metrics on the device and, at the
  end of the window, writes them, with speed and progress."""

  def __init__(self, writer: summaries.SummaryWriter, schedule, num_steps: int):
    self.writer, self.schedule, self.num_steps = writer, schedule, num_steps
    self._open()

  def _open(self) -> None:
    self.sums, self.steps, self.start = None, 0, time.time()

  def add(self, sums: dict[str, jax.Array], fill: dict[str, float]) -> None:
    self.sums, self.steps = _accumulate(self.sums, {**sums, **fill}), self.steps + 1

  def write(self, step: int) -> dict[str, float]:
    """Writes the window's metrics and logs the progress; returns the metrics."""
    sums, steps, seconds = dict(self.sums), self.steps, time.time() - self.start
    skipped = int(sums.pop("nonfinite"))  # Their metrics are zeros.
    means = {k: float(sums.pop(k)) / max(steps - skipped, 1)
             for k in ("grad_norm", "train/inputs_fill", "train/targets_fill")}
    summary = losses.summarize(sums)
    scalars = {**{f"train/{k}": v for k, v in summary.items()},
               "train/grad_norm": means.pop("grad_norm"), **means,
               "train/skipped_steps": float(skipped),
               "train/learning_rate": float(self.schedule(step - 1)),
               "train/target_tokens_per_sec": summary["tokens"] / seconds,
               "train/steps_per_sec": steps / seconds}
    self.writer.write_scalars(step, scalars, log=False)  # One line for the window:
    left = datetime.timedelta(seconds=round((self.num_steps - step) * seconds / steps))
    logging.info("step %d of %d (%.0f%%): loss %.4g, accuracy %.4g, grad_norm %.3g, "
                 "lr %.3g%s; %.0f tokens/s, %.2f steps/s, %s left", step, self.num_steps,
                 100 * step / self.num_steps, summary["loss"], summary["accuracy"],
                 scalars["train/grad_norm"], scalars["train/learning_rate"],
                 f", {skipped} steps skipped" if skipped else "",
                 scalars["train/target_tokens_per_sec"], steps / seconds, left)
    self._open()
    return {"step": step, **summary}


class NonFiniteGuard:
  """Host side of the non-finite policy: reads the steps' `nonfinite` flags only when
  asked (at log windows and before checkpoints), so no step waits on the host."""

  def __init__(self, cfg: config_lib.TrainConfig, ckpt: ocp.CheckpointManager):
    self.cfg, self.ckpt = cfg, ckpt
    self.pending: list[tuple[int, jax.Array]] = []
    self.in_row = self.skipped = 0

  def add(self, step: int, flag: jax.Array) -> None:
    self.pending.append((step, flag))

  def check(self) -> None:
    """Raises NonFiniteError if the policy says stop."""
    for step, flag in self.pending:
      if not int(flag):
        self.in_row = 0
        continue
      self.in_row, self.skipped = self.in_row + 1, self.skipped + 1
      logging.warning("step %d: non-finite loss or gradient; update skipped (%d in a row, "
                      "%d in all).", step, self.in_row, self.skipped)
      stop = self.cfg.on_nonfinite == "stop" or self.in_row >= self.cfg.max_nonfinite_in_row
      if stop:
        self.ckpt.wait_until_finished()
        last = self.ckpt.latest_step()
        raise NonFiniteError(
            f"non-finite loss or gradient at step {step} ({self.in_row} in a row; "
            f"train.on_nonfinite={self.cfg.on_nonfinite!r}, train.max_nonfinite_in_row="
            f"{self.cfg.max_nonfinite_in_row}); no update was applied. Last good "
            f"checkpoint: {'none' if last is None else f'step {last}'} in "
            f"{self.ckpt.directory}.")
    self.pending = []


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains (resuming from `workdir` when it has checkpoints), then evaluates BLEU.

  Returns the final held-out scores and the training metrics of each logged window
  (of this invocation; a resumed run reports from where it resumed). Raises InputError
  (before anything is written), NonFiniteError, or Preempted after checkpointing.
  """
  run_start = time.time()
  cfg, mesh, changes = preflight(config, workdir)  # The ConfigDict stops here.
  epath.Path(workdir).mkdir(parents=True, exist_ok=True)
  lead = jax.process_index() == 0
  if lead:  # How an earlier start ended (main.py); running again now.
    (epath.Path(workdir) / "exit.json").unlink(missing_ok=True)
  writer = summaries.SummaryWriter(workdir, write_events=lead)
  ckpt = checkpoint.manager(workdir, cfg.train.keep_checkpoints)
  if lead:
    _save_config(config, workdir, writer, changes, ckpt.latest_step())
  try:
    task = tasks.load_task(cfg.data, workdir)
  except ValueError as e:  # Problems in the data itself (file and line).
    raise config_lib.InputError(str(e)) from e
  logging.info("task %s: %d train / %d held-out pairs, vocabulary %d", cfg.data.task,
               len(task.train), len(task.eval), task.tokenizer.vocab_size)

  run, state = make_run(config_lib.with_vocab(cfg, task.tokenizer.vocab_size), mesh, ckpt)
  cfg, start_step, num_steps = run.cfg, int(state.step), run.cfg.train.num_train_steps
  if start_step:
    logging.info("resumed from checkpoint at step %d", start_step)
  logging.info("model: %.2fM parameters; mesh %s",
               sum(x.size for x in jax.tree.leaves(state.params)) / 1e6, dict(mesh.shape))
  _log_parameter_overview(state.params, workdir, lead)
  if attention.attention_implementation(cfg.model) == "cudnn" and \
      cfg.train.batching == "packed":
    logging.info("attention: cuDNN for unpacked batches; packed rows (train.batching="
                 "'packed') take XLA, since JAX's public API has no cuDNN segment mask")
  most, fraction = batching.empty_rows_added(task.train, cfg.train, cfg.data.max_length,
                                             run.row_multiple)
  if most:
    logging.info("batches split over %d data shards x %d microbatches: up to %d empty "
                 "rows added to a batch (%.1f%% of rows); the examples do not depend on it",
                 partitioning.data_shards(mesh), cfg.train.grad_accum_steps, most,
                 100 * fraction)
  guard = NonFiniteGuard(cfg.train, ckpt)
  window, history = TrainWindow(writer, run.schedule, num_steps), []
  steps = range(start_step, num_steps)
  batches = (prefetch(functools.partial(_device_batch, run, task), steps, cfg.train.prefetch)
             if cfg.train.prefetch else (_device_batch(run, task, step) for step in steps))
  done = start_step
  record_stall = lambda reason: lead and files.record_exit(workdir, watchdog.EXIT_STALLED,
                                                           reason)
  with run.activate(), count_compiles() as compiled, preemption.watch() as stop, \
      contextlib.closing(batches), _disk_full_named(workdir, lambda: done), \
      watchdog.watch(cfg.train.stall_timeout_s, record_stall, lead) as dog:
    compile_start = time.time()
    compile_ahead(programs_to_compile(run, task, state))
    ahead = len(compiled)
    logging.info("compiled %d programs in %.1f s; step %d starts %.1f s after start-up",
                 ahead, time.time() - compile_start, start_step + 1, time.time() - run_start)
    dog.beat(start_step)
    for step, (batch, fill) in zip(steps, batches):
      _maybe_stall(cfg.train.inject_stall_at, step + 1)
      state, out = run.train_step(state, batch, run.dropout_key)
      done = step + 1
      dog.beat(done)
      guard.add(done, out["nonfinite"])
      window.add(out, fill)
      stopping = stop.requested(done)
      if stopping or _due(done, cfg.train.log_every_steps, num_steps):
        guard.check()
        history.append(window.write(done))
      if stopping:
        _checkpoint_and_stop(ckpt, state, writer, done, stop.reason)
      if _due(done, cfg.train.eval_every_steps, num_steps):
        writer.write_scalars(done, {f"eval/{k}": v for k, v in
                                    evaluate_loss(run, state.params, task.eval).items()})
      if cfg.train.bleu_every_steps and done % cfg.train.bleu_every_steps == 0 \
          and done != num_steps:
        evaluate_translation(state.params, run.model, task, cfg, workdir, done, writer)
        dog.beat(done)
      if _due(done, cfg.train.checkpoint_every_steps, num_steps):
        guard.check()  # A checkpoint never holds the state after a non-finite step.
        checkpoint.check_space(workdir, done, state)
        ckpt.save(done, args=ocp.args.StandardSave(state))
    ckpt.wait_until_finished()
    dog.pause()
    final = evaluate_translation(state.params, run.model, task, cfg, workdir, num_steps,
                                 writer)
  logging.info("compiled %d programs before step 1 and %d small ones after", ahead,
               len(compiled) - ahead)
  writer.close()
  results = {k: final[k] for k in (*bleu.SCORES, "signature")}
  results["step"] = int(state.step)
  if lead:
    _report(workdir, results, final, task, cfg.train.num_samples)
  return {**results, "history": history}


@contextlib.contextmanager
def _disk_full_named(workdir: str, step: Callable[[], int]):
  """A full disk, as Orbax's writer threads report it, becomes one DiskFull."""
  try:
    yield
  except Exception as e:
    if checkpoint.out_of_space(e):
      raise checkpoint.disk_full(workdir, step(), e) from None
    raise


def _log_parameter_overview(params: Any, workdir: str, lead: bool) -> None:
  """clu's table of every parameter's shape, dtype and size, with the total, written to
  WORKDIR/parameters.txt and named in the log (no statistics: they would read every
  process's shards)."""
  overview = parameter_overview.get_parameter_overview(params, include_stats=False)
  path = epath.Path(workdir) / "parameters.txt"
  logging.info("parameters: %d arrays, %s (a table: %s)", len(jax.tree.leaves(params)),
               overview.splitlines()[-1].removeprefix("Total: "), path)
  if lead:
    files.write_atomic(path, overview + "\n")


def _maybe_stall(inject_stall_at: tuple[int, ...], step: int) -> None:
  """Fault injection (train.inject_stall_at = (step, process)): that process hangs
  before that step, as a stuck host would; the others wait in its collective."""
  if inject_stall_at and tuple(inject_stall_at) == (step, jax.process_index()):
    logging.warning("train.inject_stall_at: process %d hangs before step %d",
                    jax.process_index(), step)
    threading.Event().wait()


def _device_batch(run: Run, task: tasks.Task, step: int):
  """Train batch `step` on the mesh, and how full its rows are (in the prefetch thread)."""
  batch = run.train_batch(task.train, step)
  fill = {f"train/{k}_fill": float(np.mean(batch[k] != 0)) for k in ("inputs", "targets")}
  return partitioning.shard_batch(batch, run.mesh), fill


def _checkpoint_and_stop(ckpt, state: TrainState, writer, step: int, reason: str):
  ckpt.save(step, args=ocp.args.StandardSave(state), force=True)
  ckpt.wait_until_finished()
  writer.close()
  logging.warning("stopped at step %d (%s); checkpoint written.", step, reason)
  raise Preempted(step, reason)


def _report(workdir: str, results: dict, final: dict, task: tasks.Task,
            num_samples: int) -> None:
  """Writes results.json, which marks the run finished for the launcher (whole or not at
  all), and prints the scores and a few held-out translations."""
  files.write_atomic(epath.Path(workdir) / "results.json", json.dumps(results, indent=2))
  print(f"\nHeld-out ({len(task.eval_sources)} pairs never seen in training): "
        f"sacreBLEU {final['bleu']:.2f}, exact match {100 * final['exact_match']:.1f}%")
  print(f"sacreBLEU signature: {final['signature']}")
  for src, hyp, ref in list(zip(task.eval_sources, final["hypotheses"],
                                task.eval_references))[:num_samples]:
    print(f"  {src}\n    -> {hyp}   [{'ok' if hyp == ref else 'reference: ' + ref}]")


def prefetch(produce: Callable[[int], T], steps: Iterable[int], depth: int = 2
             ) -> Iterator[T]:
  """produce(step) for each step, in order, computed up to `depth` steps ahead in a
  background thread: building a batch and sending it to the devices overlap the
  device's work on the previous step. An error in `produce` is raised here; closing
  the generator (a finished loop, an exception, a stop on a signal) ends the thread."""
  results: queue.Queue = queue.Queue(depth)
  stop = threading.Event()
  end = object()

  def put(item) -> bool:
    while not stop.is_set():
      try:
        results.put(item, timeout=0.05)
        return True
      except queue.Full:
        pass
    return False

  def work():
    try:
      for step in steps:
        if not put((produce(step), None)):
          return
      put((end, None))
    except BaseException as e:  # Handed to the consumer, raised there.
      put((None, e))

  thread = threading.Thread(target=work, name="prefetch", daemon=True)
  thread.start()
  try:
    while True:
      item, error = results.get()
      if error is not None:
        raise error
      if item is end:
        return
      yield item
  finally:
    stop.set()
    thread.join()
