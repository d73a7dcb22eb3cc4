"""The training loop's parts: cadences, the log window, the non-finite policy, the
bound on how far the host runs ahead, and the prefetch thread.

`train.train_and_evaluate` drives them; each is small enough to test alone.
"""

from __future__ import annotations

import collections
import datetime
import logging
import queue
import threading
import time
from typing import Any, Callable, Iterable, Iterator, TypeVar

import jax
import orbax.checkpoint as ocp

from transformer_jax import config as config_lib, summaries
from transformer_jax.training import metrics

T = TypeVar("T")


def due(step: int, every: int, last: int) -> bool:
  """A cadence of `every` steps (0: never) that always includes the last step."""
  return step == last or (every > 0 and step % every == 0)


class InFlight:
  """Keeps the host at most `depth` steps ahead of the devices.

  JAX returns from a step before the devices finish it. Left unbounded, the host queues
  programs without limit, and XLA's CPU client can deadlock: a device admits 32
  launched programs at a time, a multi-device program is launched on each device
  separately, and when one device's launch of a step comes after 32 later launches
  (which all wait for that step), the step's all-reduce waits forever for that device
  (an abort: "Termination timeout for `all reduce`"). Busy machines made it likely.
  Two steps ahead still keeps any accelerator fed: the next step is queued while one
  runs.
  """

  def __init__(self, depth: int = 2):
    self.depth, self.pending = depth, collections.deque()

  def add(self, value: Any) -> None:
    """`value`: an output of the newest step; waits for the step `depth` before it."""
    self.pending.append(value)
    while len(self.pending) > self.depth:
      jax.block_until_ready(self.pending.popleft())


class TrainWindow:
  """The steps since the last log line: merges their metrics on the device (one small
  program a step) and, at the end of the window, writes them, with speed and progress."""

  def __init__(self, writer: summaries.SummaryWriter, schedule, num_steps: int):
    self.writer, self.schedule, self.num_steps = writer, schedule, num_steps
    self._open()

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


class NonFiniteError(RuntimeError):
  """Training stopped on non-finite losses or gradients (per train.on_nonfinite)."""


class NonFiniteGuard:
  """Host side of the non-finite policy: reads the steps' `skipped_steps` flags only
  when asked (at log windows and before checkpoints), so no step waits on the host."""

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
