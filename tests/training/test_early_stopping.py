"""The best checkpoint and the patience (transformer_jax/training/early_stopping.py)."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from configs import transformer as transformer_configs
from conftest import tiny_training_config
from transformer_jax import checkpoint, config as config_lib
from transformer_jax.inference import restore
from transformer_jax.training import early_stopping, loop


@pytest.mark.slow
def test_the_best_checkpoint_is_kept_and_the_run_stops_when_it_stops_improving(tmp_path):
  """train.keep_best_by and train.early_stop_patience. Steps 5-13 are skipped as
  non-finite, so the parameters after steps 4, 6 and 8 are one and the same: the eval
  losses at 6 and 8 do not improve on step 4's, and patience 2 stops the run at 8."""
  config = tiny_training_config(20)
  config.train.update(eval_every_steps=2, keep_best_by="eval/loss", early_stop_patience=2,
                      inject_nonfinite_at=tuple(range(5, 14)))
  workdir = str(tmp_path / "run")
  scores = loop.train_and_evaluate(config, workdir)
  assert scores["step"] == 8 and scores["best"]["stopped_at"] == 8, scores
  assert scores["best"]["step"] in (2, 4), scores
  with open(os.path.join(workdir, "results.json")) as f:  # Finished, for the launcher.
    assert json.load(f)["best"]["stopped_at"] == 8
  trained = restore.load_workdir(workdir)
  best, step = restore.restore_params(trained, "best")
  latest, _ = restore.restore_params(trained)
  kept = checkpoint.manager(workdir, 1, read_only=True)
  assert step == scores["best"]["step"] and kept.metrics(step)["eval/loss"] == \
      scores["best"]["value"]  # One of the checkpoints, saved with its metric.
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(best), jax.device_get(latest))
  again = loop.train_and_evaluate(config, workdir)  # Stopped early: trains no further.
  assert again["step"] == 8 and again["history"] == []


def test_keep_best_by_bleu_keeps_the_highest(tmp_path):
  """train.keep_best_by="eval/bleu" (the Multi30k recipe's): BLEU improves upwards, so
  the checkpoint kept is that of the highest BLEU, and evaluations below it count
  towards the patience."""
  cfg = dataclasses.replace(config_lib.parse(transformer_configs.get_config(
      "numbers,smoke")).train, keep_best_by="eval/bleu", bleu_every_steps=2,
      early_stop_patience=2)
  tracker = early_stopping.Best(cfg, str(tmp_path))
  manager = checkpoint.manager(str(tmp_path), 1, keep_best_by=cfg.keep_best_by)
  stops = []
  for step, bleu in ((2, 10.0), (4, 30.0), (6, 20.0), (8, 25.0)):  # Saved every time.
    stops.append(tracker.update(step, {"eval/bleu": bleu, "eval/loss": 1.0}))
    manager.save(step, args=ocp.args.StandardSave({"step": jnp.array(step)}),
                 metrics=tracker.metrics(step))
  manager.wait_until_finished()
  assert stops == [False, False, False, True]
  assert (tracker.record["step"], tracker.record["value"]) == (4, 30.0)
  assert manager.all_steps() == [4, 8]  # The best, and the last train.keep_checkpoints.
  mngr, best = checkpoint.best_step(str(tmp_path), "eval/bleu")
  assert best == 4 and int(mngr.restore(4)["step"]) == 4


# Which way each train.keep_best_by metric improves: the specification, written out.
IMPROVES = {"eval/loss": "down", "eval/nll": "down", "eval/accuracy": "up",
            "eval/bleu": "up", "eval/bleu_lc": "up", "eval/chrf": "up",
            "eval/paper_bleu": "up", "eval/paper_bleu_2018": "up", "eval/lowercase_bleu": "up"}


def test_every_metric_a_run_can_keep_the_best_by_has_its_direction_here():
  assert set(IMPROVES) == set(config_lib.KEEP_BEST_BY)


@pytest.mark.parametrize("metric", sorted(IMPROVES))
def test_the_best_checkpoint_and_the_patience_follow_the_metrics_direction(tmp_path, metric):
  """Values 10, 30, 20, 25 (for a metric that improves upwards; their negatives for one
  that improves downwards): the best is step 4's, kept among the checkpoints and read
  by --step=best, and the two evaluations after it spend a patience of 2."""
  sign = 1.0 if IMPROVES[metric] == "up" else -1.0
  assert config_lib.lower_is_better(metric) == (sign < 0)
  assert config_lib.lower_is_better(f"test_avg5/{metric.split('/')[1]}") == (sign < 0)
  cfg = dataclasses.replace(config_lib.parse(transformer_configs.get_config(
      "numbers,smoke")).train, keep_best_by=metric, bleu_every_steps=2,
      early_stop_patience=2)
  tracker = early_stopping.Best(cfg, str(tmp_path))
  manager = checkpoint.manager(str(tmp_path), 1, keep_best_by=metric)
  stops = []
  for step, value in ((2, 10.0), (4, 30.0), (6, 20.0), (8, 25.0)):
    stops.append(tracker.update(step, {metric: sign * value}))
    manager.save(step, args=ocp.args.StandardSave({"step": jnp.array(step)}),
                 metrics=tracker.metrics(step))
  manager.wait_until_finished()
  assert stops == [False, False, False, True]
  assert (tracker.record["step"], tracker.record["value"]) == (4, sign * 30.0)
  assert manager.all_steps() == [4, 8]
  _, best = checkpoint.best_step(str(tmp_path), metric)
  assert best == 4


@pytest.mark.parametrize("metric, values", [
    ("eval/loss", (3.0, 3.5, 2.0, 2.5, 2.8, 2.9)),
    ("eval/bleu", (10.0, 9.0, 20.0, 15.0, 12.0, 11.0)),
])
def test_the_patience_counts_from_the_last_improvement(tmp_path, metric, values):
  """early_stop_patience=3: one evaluation no better, an improvement (the count starts
  again), then three no better: the run stops at the sixth, not the fourth."""
  cfg = dataclasses.replace(config_lib.parse(transformer_configs.get_config(
      "numbers,smoke")).train, keep_best_by=metric, early_stop_patience=3,
      bleu_every_steps=2)
  tracker = early_stopping.Best(cfg, str(tmp_path))
  stops = [tracker.update(2 * (i + 1), {metric: v}) for i, v in enumerate(values)]
  assert stops == [False, False, False, False, False, True]
  assert (tracker.record["step"], tracker.record["stopped_at"]) == (6, 12)


def test_a_best_checkpoint_kept_in_best_by_an_earlier_version_is_still_read(tmp_path):
  """A workdir whose best checkpoint is in WORKDIR/best/<step> with best/best.json (the
  layout before the best joined checkpoints/): --step=best reads it and the record goes
  on, until a better value is saved among the checkpoints."""
  earlier = ocp.CheckpointManager(tmp_path / "best",
                                  options=ocp.CheckpointManagerOptions(max_to_keep=1))
  earlier.save(4, args=ocp.args.StandardSave({"step": jnp.array(4)}))
  earlier.wait_until_finished()
  (tmp_path / "best" / "best.json").write_text(json.dumps(
      {"metric": "eval/bleu", "value": 30.0, "step": 4, "since": 0, "stopped_at": None,
       "evaluated_at": 4}))
  mngr, step = checkpoint.best_step(str(tmp_path), "eval/bleu")
  assert (step, int(mngr.restore(step)["step"])) == (4, 4)
  cfg = dataclasses.replace(config_lib.parse(transformer_configs.get_config(
      "numbers,smoke")).train, keep_best_by="eval/bleu", bleu_every_steps=2)
  tracker = early_stopping.Best(cfg, str(tmp_path))
  manager = checkpoint.manager(str(tmp_path), 2, keep_best_by="eval/bleu")
  for step, bleu in ((6, 20.0), (8, 35.0)):
    tracker.update(step, {"eval/bleu": bleu})
    manager.save(step, args=ocp.args.StandardSave({"step": jnp.array(step)}),
                 metrics=tracker.metrics(step))
  manager.wait_until_finished()
  assert tracker.improved(8) and not tracker.improved(6)
  assert checkpoint.best_step(str(tmp_path), "eval/bleu")[1] == 8
  assert json.loads((tmp_path / "best.json").read_text())["step"] == 8
