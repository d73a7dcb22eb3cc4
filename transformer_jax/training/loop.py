"""Training and evaluation: `train_and_evaluate(config, workdir)` is the one hand-off
from the command line to the library.

It reads top to bottom in phases: config and data checked (`preflight`), the run folder
taken and opened (`run_files`), data, the run (`run.make_run`, restored if the workdir
has a checkpoint), its programs compiled (`compilation`), the loop with its cadences
(log, evaluate, BLEU, checkpoint, stop on a signal or a stall), and the final
evaluation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import threading
import time
from typing import Any, Callable, Sequence

import jax
import jax.experimental.multihost_utils
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from transformer_jax import checkpoint, config as config_lib, files, partitioning, summaries
from transformer_jax.data import batching, corpora, parallel_data, tasks
from transformer_jax.inference import bleu, translation
from transformer_jax.model import attention
from transformer_jax.training import averaging, cadence, compilation, early_stopping
from transformer_jax.training import metrics, nonfinite, preemption, progress, run as run_lib
from transformer_jax.training import run_ahead, run_files, saving, watchdog, workdir_lock
from transformer_jax.training.step import TrainState


NonFiniteError = nonfinite.NonFiniteError
Preempted = preemption.Preempted


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


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains (resuming from `workdir` when it has checkpoints), then evaluates BLEU.

  Returns the final held-out scores and the training metrics of each logged window
  (of this invocation; a resumed run reports from where it resumed). Raises InputError
  (before anything is written), NonFiniteError, or Preempted after checkpointing.
  """
  run_start = time.time()
  cfg, mesh, changes = preflight(config, workdir)  # The ConfigDict stops here.
  with run_files.sole_writer(workdir) as lease:  # Every process is past it together.
    run_files.check_steps(cfg, workdir)
    run_files.check_checkpoints_without_config(cfg, mesh, workdir)
    if jax.process_count() > 1:  # None writes before all have read the workdir as it was.
      jax.experimental.multihost_utils.sync_global_devices("workdir checked")
    return _train_and_evaluate(config, cfg, mesh, changes, workdir, lease, run_start)


def _train_and_evaluate(config: ml_collections.ConfigDict, cfg: config_lib.Config,
                        mesh: jax.sharding.Mesh, changes: Sequence[str], workdir: str,
                        lease: workdir_lock.Lease | None, run_start: float
                        ) -> dict[str, Any]:
  lead = lease is not None
  writer, ckpt = run_files.open_run_files(config, cfg, workdir, changes, lead)
  if (done := run_files.finished(workdir, ckpt.latest_step(), cfg.train.num_train_steps)) is not None:
    writer.close()  # Before any data is read or model built.
    return {**done, "history": [], "recompiled": []}
  try:
    task = tasks.load_task(cfg.data, workdir)
  except config_lib.InputError:  # Named already (NotPrepared among them).
    raise
  except ValueError as e:  # Problems in the data itself (file and line).
    raise config_lib.InputError(str(e)) from e
  logging.info("task %s: %d train / %d held-out pairs, vocabulary %d", config.data.task,
               len(task.train), len(task.eval), task.tokenizer.vocab_size)
  run, restored = run_lib.make_run(_with_task(cfg, task), mesh, ckpt)
  state, average = averaging.Window.resume(run.cfg.train, restored)
  _log_start(run, state, task, workdir, lead)
  best = early_stopping.Best(run.cfg.train, workdir)
  state, final, history, recompiled = _train(run, state, average, task, ckpt, best, writer,
                                             workdir, run_start, lease)
  writer.close()
  results = {k: final[k] for k in (*bleu.SCORES, "signature", "averaged", "test")
             if final.get(k) is not None}
  results["step"] = int(state.step)
  if best.metric:  # Where the best checkpoint is, and whether the run stopped early.
    results["best"] = {k: best.record[k] for k in ("metric", "value", "step", "stopped_at")}
  if lead:
    run_files.report(workdir, results, final, task, run.cfg.train.num_samples)
  return {**results, "history": history, "recompiled": recompiled}


def _with_task(cfg: config_lib.Config, task: tasks.Task) -> config_lib.Config:
  """`cfg` with the tokenizer's vocabulary, and its epoch cadences in steps."""
  cfg = config_lib.with_vocab(cfg, task.tokenizer.vocab_size)
  if cfg.train.eval_every_epochs or cfg.train.checkpoint_every_epochs:
    epoch = batching.steps_per_epoch(task.train, cfg.train)
    cfg = config_lib.with_epochs(cfg, epoch)
    logging.info("an epoch is %d steps: the held-out loss every %d steps, a checkpoint "
                 "every %d", epoch, cfg.train.eval_every_steps,
                 cfg.train.checkpoint_every_steps)
  return cfg


def _train(run: run_lib.Run, state: TrainState, average: averaging.Window, task: tasks.Task,
           ckpt: ocp.CheckpointManager, best: early_stopping.Best,
           writer: summaries.SummaryWriter, workdir: str, run_start: float,
           lease: workdir_lock.Lease | None = None
           ) -> tuple[TrainState, dict[str, Any], list[dict[str, float]], list[str]]:
  """Compiles, trains to train.num_train_steps, and translates the held-out set.
  Returns the final state, its scores, each log window's metrics and the programs
  compiled ahead that compiled again later (none, unless a call misses jit's cache)."""
  cfg, lead = run.cfg, jax.process_index() == 0
  start_step, num_steps = int(state.step), cfg.train.num_train_steps
  steps = range(start_step, start_step if best.stopped else num_steps)
  if best.stopped:  # Stopped early before: nothing more to train.
    logging.info("stopped early at step %d (WORKDIR/best.json): not training on",
                 best.record["stopped_at"])
  batches = (run_ahead.prefetch(functools.partial(_device_batch, run, task), steps,
                                 cfg.train.prefetch)
             if cfg.train.prefetch else (_device_batch(run, task, step) for step in steps))
  guard, in_flight = nonfinite.NonFiniteGuard(cfg.train, ckpt), run_ahead.InFlight()
  saver = saving.Saver(ckpt, workdir, cfg.train, average, guard)
  history = []
  done, scores = start_step, None  # scores: the latest BLEU evaluation.
  record_stall = lambda reason: lead and run_files.record_exit(workdir, watchdog.EXIT_STALLED,
                                                           reason)
  with run.activate(), compilation.count_compiles() as compiled, preemption.watch() as stop, \
      contextlib.closing(batches), \
      _disk_full_named(workdir, lambda: saver.writing or done), \
      watchdog.watch(cfg.train.stall_timeout_s, record_stall, lead) as dog:
    compile_start = time.time()
    compilation.compile_ahead(compilation.programs_to_compile(run, task, state))
    ahead = len(compiled)
    logging.info("compiled %d programs in %.1f s%s; step %d starts %.1f s after start-up",
                 ahead, time.time() - compile_start, compilation.cache_note(compiled),
                 start_step + 1, time.time() - run_start)
    window = progress.TrainWindow(writer, run.schedule, num_steps)  # Timed from here.
    dog.beat(start_step)
    for step, (batch, fill) in zip(steps, batches):
      _maybe_stall(cfg.train.inject_stall_at, step + 1)
      state, out = run.train_step(state, batch, run.dropout_key)
      done = step + 1
      average.add(done, state.params)  # At the averaging snapshots' steps (Sec. 6.1).
      dog.beat(done)
      in_flight.add(out)
      guard.add(done, out.skipped_steps.total)
      window.add(out, fill)
      stopping = stop.requested(done)
      if stopping or cadence.due(done, cfg.train.log_every_steps, num_steps):
        guard.check()
        history.append(window.write(done))
      if stopping:
        _checkpoint_and_stop(saver, state, writer, done, stop.reason, best.metrics(done))
      if lease is not None:
        lease.check()  # Taken over while this run's heartbeat stopped: write no more.
      patience_spent, scores = _evaluate_and_save(run, state, task, saver, writer, workdir,
                                                  best, done, scores)
      dog.beat(done)  # Evaluating is not stalling.
      if patience_spent:
        break
    saver.wait()
    dog.pause()
    params, averaged = averaging.final_params(state, average, workdir, cfg.train)
    if len(averaged) < cfg.train.average_last:
      logging.warning("the final evaluation averages %d checkpoint(s) %s, fewer than "
                      "train.average_last=%d: no more were written or kept up to step %d",
                      len(averaged), averaged, cfg.train.average_last, averaged[-1])
    final = scores if scores and scores["step"] == int(state.step) and len(averaged) == 1 \
        else evaluate_translation(params, run.model, task, cfg, workdir, int(state.step),
                                  writer, averaged)
    final = {**final, "test": evaluate_test(params, run.model, task, cfg, workdir,
                                            int(state.step), averaged)}
  recompiled = compilation.recompiled(compiled[:ahead], compiled[ahead:])
  logging.info("compiled %d programs before step %d and %d small ones after", ahead,
               start_step + 1, len(compiled) - ahead - len(recompiled))
  if recompiled:
    logging.warning("compiled again after the ahead-of-time pass (a jit cache miss): %s",
                    ", ".join(recompiled))
  return state, final, history, recompiled


def _evaluate_and_save(run: run_lib.Run, state: TrainState, task: tasks.Task,
                       saver: saving.Saver, writer: summaries.SummaryWriter,
                       workdir: str, best: early_stopping.Best, done: int,
                       scores: dict | None) -> tuple[bool, dict | None]:
  """The loss on held-out pairs, BLEU (at the last step unless the final evaluation
  averages checkpoints: train.average_last) and a checkpoint, each when due after step
  `done` (a checkpoint deferred while the previous one is written: saving.Saver); a
  checkpoint of this step when train.keep_best_by improves or its patience is spent,
  saved with the metric's value. Returns whether the patience is spent, and the latest
  BLEU scores."""
  cfg, last, spent = run.cfg.train, run.cfg.train.num_train_steps, False
  if cadence.due(done, cfg.eval_every_steps, last):
    scalars = {f"eval/{k}": v for k, v in evaluate_loss(run, state.params, task.eval).items()}
    writer.write_scalars(done, scalars)
    spent |= best.update(done, scalars)
  if cadence.bleu_due(done, cfg.bleu_every_steps, last, cfg.average_last):
    scores = evaluate_translation(state.params, run.model, task, run.cfg, workdir, done,
                                  writer)
    spent |= best.update(done, {f"eval/{k}": scores[k] for k in bleu.SCORES})
  saver.after_step(done, state, now=spent or best.improved(done), metrics=best.metrics(done))
  return spent, scores


def evaluate_loss(run: run_lib.Run, params, data: parallel_data.ParallelData) -> dict[str, float]:
  """Loss metrics over the first train.num_eval_batches batches of held-out pairs."""
  cfg, total, in_flight = run.cfg, None, run_ahead.InFlight()
  rows = run_lib.eval_rows(cfg, run.mesh)
  for i, batch in enumerate(batching.eval_batches(data, rows, cfg.data.max_length)):
    if i >= cfg.train.num_eval_batches:
      break
    total = metrics.merge(total, run.eval_step(params,
                                               partitioning.shard_batch(batch, run.mesh)))
    in_flight.add(total)
  return metrics.summary(total)


def evaluate_translation(params, model, task, cfg, workdir, step, writer,
                         averaged: Sequence[int] = ()) -> dict[str, Any]:
  """BLEU on the held-out pairs at `step`, with the parameters of that step or the mean
  of checkpoints `averaged` (then in the log, its file name and the scores)."""
  start = time.time()
  mean = f"_avg{len(averaged)}" if len(averaged) > 1 else ""
  scores = translation.translate_and_score(
      params, model, task.tokenizer, task.eval_sources, task.eval_references, cfg.decode,
      cfg.data.target_lang, epath.Path(workdir) / "translations" / f"step_{step}{mean}.txt")
  writer.write_scalars(step, {f"eval/{k}": scores[k] for k in bleu.SCORES})
  logging.info("step %d%s: sacreBLEU %.2f (paper-style %.2f), exact match %.1f%% on %d "
               "held-out pairs (%.0f s) [%s]", step,
               f", the mean of checkpoints {list(averaged)}" if mean else "", scores["bleu"],
               scores["paper_bleu"], 100 * scores["exact_match"], len(scores["hypotheses"]),
               time.time() - start, scores["signature"])
  return {**scores, "step": step, **({"averaged": list(averaged)} if mean else {})}


def evaluate_test(params, model, task, cfg, workdir, step, averaged: Sequence[int]
                  ) -> dict[str, Any] | None:
  """The data's test split (WMT14: newstest2014) translated with the final evaluation's
  parameters, beam and alpha, and scored as the paper did and by sacreBLEU, beside the
  paper's figure for train.paper_row where the dataset has one (`paper_figure`); None
  without train.final_test or a test split (then one line says why). Nothing is chosen
  on it."""
  if not cfg.train.final_test:
    return None
  corpus = task.corpus
  if (name := corpus.test_set()) is None:
    logging.info("no test split scored: %s", corpus.no_test_set())
    return None
  start = time.time()
  sources, references = corpus.split("test")
  mean = f"_avg{len(averaged)}" if len(averaged) > 1 else ""
  scores = translation.translate_and_score(
      params, model, task.tokenizer, sources, references, cfg.decode, cfg.data.target_lang,
      epath.Path(workdir) / "translations" / f"{name}_step_{step}{mean}.txt")
  logging.info("step %d: %s translated in %.0f s", step, name, time.time() - start)
  return {"set": name, "sentences": len(sources),
          **{k: scores[k] for k in ("paper_bleu", "paper_bleu_2018", "bleu", "signature")},
          "averaged": list(averaged), "beam_size": cfg.decode.beam_size,
          "alpha": cfg.decode.length_penalty, "paper_row": cfg.train.paper_row,
          "paper": corpus.paper_figure(cfg.train.paper_row)}


def _log_start(run: run_lib.Run, state: TrainState, task: tasks.Task, workdir: str,
               lead: bool) -> None:
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
  run_files.write_parameter_overview(state.params, workdir, lead)
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


@contextlib.contextmanager
def _disk_full_named(workdir: str, step: Callable[[], int]):
  """A full disk, as Orbax's writer threads report it, becomes one DiskFull."""
  try:
    yield
  except Exception as e:
    if files.out_of_space(e):
      raise checkpoint.disk_full(workdir, step(), e) from None
    raise


def _maybe_stall(inject_stall_at: tuple[int, ...], step: int) -> None:
  """Fault injection (train.inject_stall_at = (step, process)): that process hangs
  before that step, as a stuck host would; the others wait in its collective."""
  if inject_stall_at and tuple(inject_stall_at) == (step, jax.process_index()):
    logging.warning("train.inject_stall_at: process %d hangs before step %d",
                    jax.process_index(), step)
    threading.Event().wait()


def _device_batch(run: run_lib.Run, task: tasks.Task, step: int):
  """Train batch `step` on the mesh, and how full its rows are (in the prefetch thread)."""
  batch = run.train_batch(task.train, step)
  fill = {f"train/{k}_fill": float(np.mean(batch[k] != 0)) for k in ("inputs", "targets")}
  return partitioning.shard_batch(batch, run.mesh), fill


def _checkpoint_and_stop(saver: saving.Saver, state: TrainState, writer, step: int,
                         reason: str, best_metrics: dict | None):
  saver.save(step, state, best_metrics, force=True)
  saver.wait()
  writer.close()
  logging.warning("stopped at step %d (%s); checkpoint written.", step, reason)
  raise Preempted(step, reason)


