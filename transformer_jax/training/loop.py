"""Training and evaluation: `train_and_evaluate(config, workdir)` is the one hand-off
from the command line to the library.

It reads top to bottom in phases: config and data checked (`run.preflight`), the run
folder taken and opened (`run_files`), data (`run.load_task`), the run (`run.make_run`,
restored if the workdir has a checkpoint), its programs compiled (`compilation`), the
loop with its cadences (log, evaluate, BLEU, checkpoint, stop on a signal or a stall),
and the final evaluation (`evaluation.final`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import jax
import jax.experimental.multihost_utils
import ml_collections
import orbax.checkpoint as ocp

from transformer_jax import summaries
from transformer_jax.data import tasks
from transformer_jax.training import averaging, compilation, early_stopping, evaluation
from transformer_jax.training import preemption, progress, run as run_lib, run_ahead
from transformer_jax.training import run_files, saving, watchdog, workdir_lock
from transformer_jax.training.step import TrainState


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains (resuming from `workdir` when it has checkpoints), then evaluates BLEU.

  Returns the final held-out scores and the training metrics of each logged window
  (of this invocation; a resumed run reports from where it resumed). Raises InputError
  (before anything is written), nonfinite.NonFiniteError, or preemption.Preempted after
  checkpointing.
  """
  run_start = time.time()
  cfg, mesh, changes = run_lib.preflight(config, workdir)  # The ConfigDict stops here.
  with run_files.sole_writer(workdir) as lease:  # Every process is past it together.
    run_files.check_steps(cfg, workdir)
    run_files.check_checkpoints_without_config(cfg, mesh, workdir)
    if jax.process_count() > 1:  # None writes before all have read the workdir as it was.
      jax.experimental.multihost_utils.sync_global_devices("workdir checked")
    writer, ckpt = run_files.open_run_files(config, cfg, workdir, changes, lease is not None)
    if (done := run_files.finished(workdir, ckpt.latest_step(),
                                   cfg.train.num_train_steps)) is not None:
      writer.close()  # Before any data is read or model built.
      return {**done, "history": [], "recompiled": []}
    task = run_lib.load_task(cfg, workdir)
    logging.info("task %s: %d train / %d held-out pairs, vocabulary %d", config.data.task,
                 len(task.train), len(task.eval), task.tokenizer.vocab_size)
    run, restored = run_lib.make_run(run_lib.with_task(cfg, task), mesh, ckpt)
    return _train_and_evaluate(run, restored, task, ckpt, writer, workdir, lease, run_start)


def _train_and_evaluate(run: run_lib.Run, restored: Any, task: tasks.Task,
                        ckpt: ocp.CheckpointManager, writer: summaries.SummaryWriter,
                        workdir: str, lease: workdir_lock.Lease | None, run_start: float
                        ) -> dict[str, Any]:
  state, average = averaging.Window.resume(run.cfg.train, restored)
  run_lib.log_start(run, state, task)
  run_files.write_parameter_overview(state.params, workdir, lease is not None)
  best = early_stopping.Best(run.cfg.train, workdir)
  state, final, history, recompiled = _train(run, state, average, task, ckpt, best, writer,
                                             workdir, run_start, lease)
  writer.close()
  results = evaluation.results(final, int(state.step), best)
  if lease is not None:
    run_files.report(workdir, results, final, task, run.cfg.train.num_samples)
  return {**results, "history": history, "recompiled": recompiled}


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
  batches = run.device_batches(task.train, steps)
  saver, in_flight = saving.Saver(ckpt, workdir, cfg.train, average), run_ahead.InFlight()
  history = []
  done, scores = start_step, None  # scores: the latest BLEU evaluation.
  record_stall = lambda reason: lead and run_files.record_exit(workdir, watchdog.EXIT_STALLED,
                                                           reason)
  with run.activate(), compilation.count_compiles() as compiled, preemption.watch() as stop, \
      contextlib.closing(batches), \
      saving.disk_full_named(workdir, lambda: saver.writing or done), \
      watchdog.watch(cfg.train.stall_timeout_s, record_stall, lead) as dog:
    compile_start = time.time()
    compilation.compile_ahead(compilation.programs_to_compile(run, task, state))
    ahead = len(compiled)
    logging.info("compiled %d programs in %.1f s%s; step %d starts %.1f s after start-up",
                 ahead, time.time() - compile_start, compilation.cache_note(compiled),
                 start_step + 1, time.time() - run_start)
    window = progress.TrainWindow(writer, run.schedule, num_steps,  # Timed from here.
                                  cfg.train.log_every_steps)
    dog.beat(start_step)
    for step, (batch, fill) in zip(steps, batches):
      watchdog.inject_stall(cfg.train.inject_stall_at, step + 1)
      state, out = run.train_step(state, batch, run.dropout_key)
      done = step + 1
      average.add(done, state.params)  # At the averaging snapshots' steps (Sec. 6.1).
      dog.beat(done)
      in_flight.add(out)
      saver.guard.add(done, out.skipped_steps.total)
      window.add(out, fill)
      stopping = stop.requested(done)
      if stopping or window.due(done):
        saver.guard.check()
        history.append(window.write(done))
      if stopping:
        _checkpoint_and_stop(saver, state, writer, done, stop.reason, best.metrics(done))
      if lease is not None:
        lease.check()  # Taken over while this run's heartbeat stopped: write no more.
      patience_spent, scores = evaluation.after_step(run, state, task, saver, writer,
                                                     workdir, best, done, scores)
      dog.beat(done)  # Evaluating is not stalling.
      if patience_spent:
        break
    saver.wait()
    dog.pause()
    final = evaluation.final(run, state, average, task, workdir, writer, scores)
  recompiled = compilation.recompiled(compiled[:ahead], compiled[ahead:])
  logging.info("compiled %d programs before step %d and %d small ones after", ahead,
               start_step + 1, len(compiled) - ahead - len(recompiled))
  if recompiled:
    logging.warning("compiled again after the ahead-of-time pass (a jit cache miss): %s",
                    ", ".join(recompiled))
  return state, final, history, recompiled


def _checkpoint_and_stop(saver: saving.Saver, state: TrainState, writer, step: int,
                         reason: str, best_metrics: dict | None):
  saver.save(step, state, best_metrics, force=True)
  saver.wait()
  writer.close()
  logging.warning("stopped at step %d (%s); checkpoint written.", step, reason)
  raise preemption.Preempted(step, reason)
