"""The run folder's files: who writes it (the lease), what it holds before a run starts
(config.json, checked against its checkpoints), and how a run ended (results.json or
exit.json), read by the launchers and `launch.results`.
"""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Any, Sequence

import jax
import jax.experimental.multihost_utils
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from clu import parameter_overview
from etils import epath
from flax import traverse_util

from transformer_jax import checkpoint, config as config_lib, files, summaries
from transformer_jax.data import tasks, tokenizer as tokenizer_lib
from transformer_jax.training import run as run_lib, workdir_lock


@contextlib.contextmanager
def sole_writer(workdir: str):
  """The workdir's lease (workdir_lock.py), held by process 0 for the whole run; every
  process raises InputError, before writing anything, when another run holds it."""
  lease, error, full = None, "", None
  if jax.process_index() == 0:
    try:
      lease = workdir_lock.Lease(workdir).acquire()
    except workdir_lock.Busy as e:
      error = str(e)
    except OSError as e:  # A full disk (exit 74), a read-only mount, another user's folder.
      full = e if files.out_of_space(e) else None
      error = (f"--workdir={workdir} cannot be written ({e.strerror or e}): training "
               "keeps its checkpoints there; use a writable folder (evaluate, translate "
               "and score read a run without writing to it).")
  if jax.process_count() > 1:  # Every process stops, or none.
    held = jax.experimental.multihost_utils.broadcast_one_to_all(np.array(not error))
    if not held and not error:
      error = f"process 0 could not take the lease of {workdir} (its log says why)."
  if full is not None:
    raise full
  if error:
    raise config_lib.InputError(error)
  try:
    yield lease
  finally:
    if lease is not None:
      lease.release()


def check_steps(cfg: config_lib.Config, workdir: str) -> None:
  """InputError (before anything is written) when the newest checkpoint is past
  train.num_train_steps: resuming would train nothing and report the old step as the
  new setting's result."""
  if not checkpoint.directory(workdir).is_dir():
    return
  newest = checkpoint.manager(workdir, 1, read_only=True).latest_step()
  steps = cfg.train.num_train_steps
  if newest is not None and newest > steps:
    raise config_lib.InputError(
        f"train.num_train_steps={steps} is below the newest checkpoint in {workdir} "
        f"(step {newest}): nothing would be trained. To go on training, raise "
        f"train.num_train_steps above {newest}; to train {steps} steps, use a new "
        f"--workdir; to use an older checkpoint, evaluate or translate with --step=N.")


def check_checkpoints_without_config(cfg: config_lib.Config, mesh: jax.sharding.Mesh,
                                     workdir: str) -> None:
  """With checkpoints but no config.json to compare with (`check_resume`), the newest
  checkpoint's array shapes (its metadata) against the model this config builds:
  InputError on a mismatch, before anything is written or moved."""
  if (epath.Path(workdir) / "config.json").exists() or \
      not checkpoint.directory(workdir).is_dir():
    return
  mngr = checkpoint.manager(workdir, 1, read_only=True)
  for step in sorted(mngr.all_steps(), reverse=True):
    try:
      saved = checkpoint.saved_shapes(mngr, step)
    except Exception:  # Damaged: restoring sets it aside and tries the one before.
      continue
    tokenizer = epath.Path(workdir) / "tokenizer.model"
    try:
      vocab = (tokenizer_lib.load(tokenizer).vocab_size if tokenizer.exists() else
               next((shape[0] for name, shape in saved.items()
                     if name.startswith("params/") and name.endswith("embedding")), 1))
    except ValueError as e:  # A damaged tokenizer.model.
      raise config_lib.InputError(str(e)) from None
    _, state = run_lib.make_run(config_lib.with_vocab(cfg, vocab), mesh, abstract=True)
    if mismatches := checkpoint.shape_mismatches(saved, checkpoint.with_saved_average(state,
                                                                                     saved)):
      raise checkpoint.mismatch_error(mngr, step, mismatches)
    return


def open_run_files(config: ml_collections.ConfigDict, cfg: config_lib.Config,
                   workdir: str, changes: Sequence[str], lead: bool
                   ) -> tuple[summaries.SummaryWriter, ocp.CheckpointManager]:
  """Creates the workdir, its summary writer and checkpoint manager; records the config."""
  epath.Path(workdir).mkdir(parents=True, exist_ok=True)
  if lead:  # How an earlier start ended (main.py); running again now.
    (epath.Path(workdir) / "exit.json").unlink(missing_ok=True)
  writer = summaries.SummaryWriter(workdir, write_events=lead)
  ckpt = checkpoint.manager(workdir, cfg.train.keep_checkpoints,
                            keep_best_by=cfg.train.keep_best_by)
  if lead:
    save_config(config, workdir, writer, changes, ckpt.latest_step())
  return writer, ckpt


def save_config(config: ml_collections.ConfigDict, workdir: str, writer,
                changes: Sequence[str], step: int | None) -> None:
  if changes:  # Recorded: which fields a resumed run changed, and from which step.
    logging.info("resuming with changed settings: %s", "; ".join(changes))
    files.append_line(epath.Path(workdir) / "config_changes.jsonl",
                      json.dumps({"from_step": step, "changes": list(changes)}))
  files.write_atomic(epath.Path(workdir) / "config.json",
                     config.to_json_best_effort(indent=2, sort_keys=True))
  flat = traverse_util.flatten_dict(config.to_dict(), sep=".")
  writer.write_hparams({k: v if isinstance(v, (int, float, str, bool)) else str(v)
                        for k, v in flat.items()})


def write_parameter_overview(params: Any, workdir: str, lead: bool) -> None:
  """clu's table of every parameter's shape, dtype and size, with the total, written to
  WORKDIR/parameters.txt and named in the log (no statistics: they would read every
  process's shards)."""
  overview = parameter_overview.get_parameter_overview(params, include_stats=False)
  path = epath.Path(workdir) / "parameters.txt"
  logging.info("parameters: %d arrays, %s (a table: %s)", len(jax.tree.leaves(params)),
               overview.splitlines()[-1].removeprefix("Total: "), path)
  if lead:
    files.write_atomic(path, overview + "\n")


def finished(workdir: str, step: int | None, num_steps: int) -> dict | None:
  """The scores in results.json when the run already ended at its latest checkpoint
  (trained to num_steps, or stopped early): then the same command again reads no data,
  builds no model, compiles and evaluates nothing. Every process reads the same file
  and checkpoint directory, so all agree."""
  path = epath.Path(workdir) / "results.json"
  if not path.exists():
    return None
  results = json.loads(path.read_text())
  if step is None or results.get("step") != step or (
      step < num_steps and not results.get("best", {}).get("stopped_at")):
    return None
  print(f"Already finished at step {step}: sacreBLEU {results['bleu']:.2f} ({path}). "
        "Raise train.num_train_steps to train on.")
  return results


def report(workdir: str, results: dict, final: dict, task: tasks.Task,
           num_samples: int) -> None:
  """Writes results.json, which marks the run finished for the launcher (whole or not at
  all), and prints the scores and a few held-out translations."""
  files.write_atomic(epath.Path(workdir) / "results.json", json.dumps(results, indent=2))
  mean = f"; the mean of the last {len(final['averaged'])} checkpoints" \
      if "averaged" in final else ""
  print(f"\nHeld-out ({len(task.eval_sources)} pairs never seen in training{mean}): "
        f"sacreBLEU {final['bleu']:.2f}, exact match {100 * final['exact_match']:.1f}%")
  print(f"sacreBLEU signature: {final['signature']}")
  for src, hyp, ref in list(zip(task.eval_sources, final["hypotheses"],
                                task.eval_references))[:num_samples]:
    print(f"  {src}\n    -> {hyp}   [{'ok' if hyp == ref else 'reference: ' + ref}]")
  if test := results.get("test"):
    print(test_line(test), flush=True)  # Into a redirected log before the process ends.


def test_line(test: dict) -> str:
  """The run's last line: the test set, the paper-style BLEU and sacreBLEU, and the
  paper's figure for the config's row of Table 2."""
  mean = (f"the mean of the last {len(test['averaged'])} checkpoints"
          if len(test["averaged"]) > 1 else f"step {test['averaged'][-1]}")
  paper = (f"; the paper's {test['paper_row']}: {test['paper']}" if test.get("paper")
           else "")
  return (f"Test {test['set']} ({test['sentences']} sentences; {mean}, beam "
          f"{test['beam_size']}, alpha {test['alpha']}): paper-style BLEU "
          f"{test['paper_bleu']:.2f}, sacreBLEU {test['bleu']:.2f}{paper} "
          f"[{test['signature']}]")


def record_exit(workdir: epath.PathLike, code: int, reason: str) -> None:
  """WORKDIR/exit.json: how the run ended, for the launchers and `launch.results` (a new
  start of the run removes it; a finished run has results.json instead)."""
  try:
    files.write_atomic(epath.Path(workdir) / "exit.json",
                       json.dumps({"code": code, "reason": reason}))
  except OSError as e:  # A full disk, say: the exit code still tells.
    logging.warning("could not write exit.json: %s", e)
