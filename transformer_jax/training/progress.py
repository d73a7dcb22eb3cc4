"""The log window: the steps since the last log line, their merged metrics, speed and
what is left, written to TensorBoard and logged as one line. (Not clu's ReportProgress:
it reports steps/s alone, timed on its own clock; a window here gives tokens/s, loss
and row fill over exactly the steps it times.)"""

from __future__ import annotations

import collections
import datetime
import logging
import time

from transformer_jax import summaries
from transformer_jax.training import cadence, metrics


class TrainWindow:
  """The steps since the last log line: merges their metrics on the device (one small
  program a step) and, at the end of the window, writes them, with speed and progress."""

  def __init__(self, writer: summaries.SummaryWriter, schedule, num_steps: int,
               every: int):
    self.writer, self.schedule, self.num_steps, self.every = writer, schedule, num_steps, every
    self._open()

  def due(self, step: int) -> bool:
    """Whether the window ends at `step`: train.log_every_steps' cadence, and the last."""
    return cadence.due(step, self.every, self.num_steps)

  def _open(self) -> None:
    self.metrics, self.fill, self.steps = None, collections.Counter(), 0
    self.start = time.time()

  def add(self, step_metrics: metrics.TrainMetrics, fill: dict[str, float]) -> None:
    """One step's metrics, and how full its batch's rows were (host floats)."""
    self.metrics = metrics.merge(self.metrics, step_metrics)
    self.fill.update(fill)
    self.steps += 1

  def write(self, step: int) -> dict[str, float]:
    """Writes the window's metrics and logs the progress; returns the metrics."""
    values, steps, seconds = metrics.summary(self.metrics), self.steps, time.time() - self.start
    skipped = int(values["skipped_steps"])
    scalars = {**{f"train/{k}": v for k, v in values.items()},
               **{k: v / steps for k, v in self.fill.items()},
               "train/learning_rate": float(self.schedule(step - 1)),
               "train/target_tokens_per_sec": values["tokens"] / seconds,
               "train/steps_per_sec": steps / seconds}
    self.writer.write_scalars(step, scalars, log=False)  # One line for the window:
    left = datetime.timedelta(seconds=round((self.num_steps - step) * seconds / steps))
    logging.info("step %d of %d (%.0f%%): loss %.4g, accuracy %.4g, grad_norm %.3g, "
                 "lr %.3g%s; %.0f tokens/s, %.2f steps/s, %s left", step, self.num_steps,
                 100 * step / self.num_steps, values["loss"], values["accuracy"],
                 values["grad_norm"], scalars["train/learning_rate"],
                 f", {skipped} steps skipped" if skipped else "",
                 scalars["train/target_tokens_per_sec"], steps / seconds, left)
    self._open()
    return {"step": step, **values}
