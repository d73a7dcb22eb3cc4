"""The best checkpoint and early stopping (train.keep_best_by, train.early_stop_patience).

The best checkpoint is one of the run's checkpoints, kept by orbax's preservation
policy (checkpoint.manager: the last train.keep_checkpoints, and the best one saved with
its metric). Each time the metric is evaluated, a better value asks for a checkpoint of
that step, saved with the value; a value no better counts towards the patience.
WORKDIR/best.json keeps the record across restarts: metric, value, step, evaluations
since it improved, and where the run stopped early. `translate` and `evaluate` read the
checkpoint with --step=best (checkpoint.best_step).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import jax
from etils import epath

from transformer_jax import config as config_lib, files


def record_path(workdir: epath.PathLike) -> epath.Path:
  """WORKDIR/best.json; a run from before the best checkpoint joined checkpoints/ has
  it in WORKDIR/best/ (read, never moved)."""
  path = epath.Path(workdir) / "best.json"
  earlier = epath.Path(workdir) / "best" / "best.json"
  return earlier if not path.exists() and earlier.exists() else path


class Best:
  """Tracks train.keep_best_by and its patience. After `update(step, ...)`,
  `metrics(step)` is what a checkpoint of that step is saved with, and `improved(step)`
  says that the step must be checkpointed (it is the best so far)."""

  def __init__(self, cfg: config_lib.TrainConfig, workdir: str):
    self.metric, self.patience = cfg.keep_best_by, cfg.early_stop_patience
    self.path = epath.Path(workdir) / "best.json"
    self.record: dict[str, Any] = {"metric": self.metric, "value": None, "step": None,
                                   "since": 0, "stopped_at": None, "evaluated_at": None}
    saved_path = record_path(workdir)
    if self.metric and saved_path.exists():
      saved = json.loads(saved_path.read_text())
      if saved["metric"] == self.metric:  # Another metric starts afresh.
        self.record = saved
    self._evaluated_at: int | None = None  # The step this process last evaluated it at.

  @property
  def stopped(self) -> bool:
    """Whether the run already stopped early (running it again trains no further)."""
    return self.record["stopped_at"] is not None

  def metrics(self, step: int) -> dict[str, float] | None:
    """What a checkpoint of `step` is saved with: {metric: value} if `step` is the best
    so far, else {} (so only improvements rank, and a tie never displaces the best);
    None without train.keep_best_by."""
    if not self.metric:
      return None
    return {self.metric: self.record["value"]} if self.improved(step) else {}

  def improved(self, step: int) -> bool:
    """Whether `step` is the best so far: its checkpoint must be saved."""
    return self._evaluated_at == step and self.record["step"] == step

  def update(self, step: int, scalars: dict[str, float]) -> bool:
    """Takes the metric from `scalars` if it is there. Returns True when the patience is
    spent: the run should stop."""
    # Not this metric, or a step counted before: a resumed run repeats the evaluations
    # after its checkpoint.
    counted = self.record["evaluated_at"]
    if self.metric not in scalars or (counted is not None and step <= counted):
      return False
    value, best = float(scalars[self.metric]), self.record["value"]
    self.record["evaluated_at"] = self._evaluated_at = step
    if best is None or (value < best if config_lib.lower_is_better(self.metric)
                        else value > best):
      self.record.update(value=value, step=step, since=0)
      logging.info("step %d: best %s so far, %.4g; its checkpoint is kept", step,
                   self.metric, value)
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
