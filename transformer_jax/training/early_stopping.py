"""The best checkpoint and early stopping (train.keep_best_by, train.early_stop_patience).

Each time the metric is evaluated, a better value saves the train state to
WORKDIR/best/<step> (one checkpoint, beside the rolling ones in checkpoints/); a value
no better counts towards the patience. WORKDIR/best/best.json keeps the record across
restarts: metric, value, step, evaluations since it improved, and where the run
stopped early. `translate` and `evaluate` read the checkpoint with --step=best.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from transformer_jax import config as config_lib, files
from transformer_jax.training import checkpoint, summaries

class Best:
  """Tracks train.keep_best_by and saves its best checkpoint; `update` says when the
  patience ran out."""

  def __init__(self, cfg: config_lib.TrainConfig, workdir: str):
    self.metric, self.patience = cfg.keep_best_by, cfg.early_stop_patience
    self.path = epath.Path(workdir) / "best" / "best.json"
    self.record: dict[str, Any] = {"metric": self.metric, "value": None, "step": None,
                                   "since": 0, "stopped_at": None, "evaluated_at": None}
    if self.metric and self.path.exists():
      saved = json.loads(self.path.read_text())
      if saved["metric"] == self.metric:  # Another metric starts afresh.
        self.record = saved
    self.manager = checkpoint.best_manager(workdir) if self.metric else None

  @property
  def stopped(self) -> bool:
    """Whether the run already stopped early (running it again trains no further)."""
    return self.record["stopped_at"] is not None

  def update(self, step: int, scalars: dict[str, float], state: Any) -> bool:
    """Takes the metric from `scalars` if it is there; saves `state` when it is the best
    so far. Returns True when the patience is spent: the run should stop."""
    # Not this metric, or a step counted before: a stopped run's final evaluation
    # repeats its last one, and a resumed run repeats those after its checkpoint.
    counted = self.record["evaluated_at"]
    if self.metric not in scalars or (counted is not None and step <= counted):
      return False
    self.record["evaluated_at"] = step
    value, best = float(scalars[self.metric]), self.record["value"]
    lower = summaries.lower_is_better(self.metric)
    if best is None or (value < best if lower else value > best):
      self.manager.save(step, args=ocp.args.StandardSave(state), force=True)
      self.manager.wait_until_finished()
      self.record.update(value=value, step=step, since=0)
      logging.info("step %d: best %s so far, %.4g; checkpoint kept in %s", step,
                   self.metric, value, self.manager.directory)
    else:
      self.record["since"] += 1
    stop = bool(self.patience) and self.record["since"] >= self.patience
    if stop:
      self.record["stopped_at"] = step
      logging.warning("step %d: stopping early: %s has not improved on %.4g (step %d) in "
                      "%d evaluations (train.early_stop_patience)", step, self.metric,
                      self.record["value"], self.record["step"], self.record["since"])
    if jax.process_index() == 0:
      files.write_atomic(self.path, json.dumps(self.record, indent=2))
    return stop
