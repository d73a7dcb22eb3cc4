"""The paper's checkpoint average (Sec. 6.1: base averages its last 5 checkpoints, big
its last 20, written 10 minutes apart), kept as a running sum on the devices.

The snapshots are the last step and the steps of train.checkpoint_every_steps' cadence
before it, train.average_last in all (`snapshot_steps`). At each of them the loop adds
the parameters to a sum held beside the train state (`Window`), and the final
evaluation divides it: no snapshot has to reach the disk or be read back, so a store
slower than the cadence delays no step (training/saving.py), and a checkpoint that a
preemption forces is never one of the snapshots. Every checkpoint written inside the
window carries the sum and the steps it holds (checkpoint.WithAverage), so a run
resumed there averages exactly what an uninterrupted run does. A run that ends before
train.num_train_steps (early stopping), or resumes from a checkpoint without the sum,
averages the snapshots it finds on disk instead (`final_params`).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
from typing import Any, Callable

import jax
import numpy as np
from flax.training import train_state

from transformer_jax import checkpoint, config as config_lib
from transformer_jax.inference import restore


def snapshot_steps(last: int, every: int, count: int) -> tuple[int, ...]:
  """The steps whose parameters the average of `count` takes: `last`, and the multiples
  of `every` before it, latest first; fewer where the run is shorter."""
  earlier = range((last - 1) // every * every, 0, -every)
  return tuple(sorted([last, *earlier[:count - 1]]))


@jax.jit
def copy_on_devices(tree: Any) -> Any:
  """The tree in new buffers on the same devices (the train step donates its own),
  dispatched without waiting."""
  return jax.tree.map(lambda x: x.copy(), tree)


# The sum's buffers are reused in place (donated): one parameters' worth of memory.
add_in_place = jax.jit(restore.accumulate, donate_argnums=0)


def programs(cfg: config_lib.TrainConfig, state: Any) -> list[Callable[[], Any]]:
  """Lowerings of the programs the window and the saver (training/saving.py) call, for
  compiling ahead of the first step (compilation.programs_to_compile): none of them
  then compiles inside the averaging window, between two steps."""
  lowerings = [functools.partial(copy_on_devices.lower, state)] * cfg.defer_checkpoints
  if cfg.average_last > 1:
    lowerings += [functools.partial(copy_on_devices.lower, state.params),
                  functools.partial(add_in_place.lower, state.params, state.params)]
  return lowerings


@dataclasses.dataclass
class Window:
  """The running sum of the parameters at the snapshot steps reached so far, on the
  devices in the parameters' shardings, and those steps."""

  steps: tuple[int, ...]  # The snapshots of a run that reaches train.num_train_steps.
  summed: list[int] = dataclasses.field(default_factory=list)
  total: Any = None

  @classmethod
  def of(cls, cfg: config_lib.TrainConfig) -> Window:
    return cls(snapshot_steps(cfg.num_train_steps, cfg.checkpoint_every_steps,
                              cfg.average_last) if cfg.average_last > 1 else ())

  @classmethod
  def resume(cls, cfg: config_lib.TrainConfig, restored: Any) -> tuple[Any, Window]:
    """The train state and the window a checkpoint held (checkpoint.restore_state). A sum
    over other snapshots than this config's (average_last, checkpoint_every_steps or
    num_train_steps changed), or none where one is due, leaves the window incomplete."""
    window = cls.of(cfg)
    if isinstance(restored, checkpoint.WithAverage):
      summed = [int(s) for s in np.asarray(restored.average_steps.addressable_data(0))]
      if summed == list(window.steps[:len(summed)]):
        window.summed, window.total = summed, restored.average_sum
      restored = train_state.TrainState(**{f.name: getattr(restored, f.name) for f in
                                           dataclasses.fields(train_state.TrainState)})
    if window.steps and int(restored.step) >= window.steps[0] and not window.summed:
      logging.warning("resumed at step %d, inside the averaging window %s, from a "
                      "checkpoint without the running sum of its snapshots: the final "
                      "evaluation averages those on disk", int(restored.step),
                      list(window.steps))
    return restored, window

  def add(self, step: int, params: Any) -> None:
    """Adds the parameters of `step` if it is the next snapshot of an unbroken sum."""
    if step not in self.steps or self.summed != list(self.steps[:self.steps.index(step)]):
      return
    self.total = copy_on_devices(params) if self.total is None else add_in_place(self.total,
                                                                                 params)
    self.summed.append(step)

  def complete(self) -> bool:
    return bool(self.steps) and self.summed == list(self.steps)

  def saved(self, state: Any, copy: bool = False) -> Any:
    """What a checkpoint of `state` holds: with the sum inside the window (with `copy`,
    a copy of it, and of the state)."""
    if copy:
      state = copy_on_devices(state)
    if not self.summed:
      return state
    steps = jax.device_put(np.asarray(self.summed, np.int32), state.step.sharding)
    return checkpoint.WithAverage(
        **{f.name: getattr(state, f.name) for f in dataclasses.fields(state)},
        average_sum=copy_on_devices(self.total) if copy else self.total,
        average_steps=steps)


def final_params(state: Any, window: Window, workdir: str, cfg: config_lib.TrainConfig
                 ) -> tuple[Any, list[int]]:
  """What the final evaluation translates with, and the steps it averages: the mean of
  the parameters of the train.average_last snapshots ending at the state's step (the
  state's own among them), from the window's sum where it holds them all, else from the
  checkpoints on disk (fewer where fewer are there); with average_last=1 the state's."""
  last = int(state.step)
  if cfg.average_last == 1:
    return state.params, [last]
  if window.complete() and window.steps[-1] == last:
    return restore.divide(window.total, len(window.summed)), list(window.summed)
  on_disk = set(restore.steps_on_disk(workdir, last))
  earlier = [s for s in snapshot_steps(last, cfg.checkpoint_every_steps,
                                       cfg.average_last)[:-1] if s in on_disk]
  ckpt = checkpoint.manager(workdir, 1, read_only=True)  # Reads the parameters alone.
  abstract = checkpoint.abstract_with_shardings(
      state.params, jax.tree.map(lambda x: x.sharding, state.params))
  params = restore.mean(itertools.chain(
      (checkpoint.restore_params(ckpt, step, abstract) for step in earlier), [state.params]))
  return params, [*earlier, last]
