r"""Checkpoints over the paper's averaging window, timed: the share of the window's
training time that the steps spend waiting on checkpoints.

  python -m transformer_jax.benchmarks.checkpointing --config=configs/transformer.py:big \
      --step_ms=12 --store_mb_per_s=200 [--scale=1.0 --dir=DIR]

The window is the train.average_last snapshots' steps, train.checkpoint_every_steps
apart and ending at train.num_train_steps, and the interval before the first (big: 20 x
600 = 12,000 steps). Over it runs the loop's own checkpoint path: averaging.Window adds
the parameters at each snapshot, saving.Saver checkpoints when due (deferring while the
previous checkpoint is written), with the project's Orbax manager (checkpoint.manager,
keeping 2: the average reads none). The state has the config's shapes and dtypes
(zeros; --scale shrinks each array's first axis, and the bandwidth with it). Each step
is a sleep of --step_ms: the device busy, the host free. The store is throttled: a save
commits no sooner than its bytes at --store_mb_per_s after it began (its files are
written to --dir too, at the disk's own speed). Waiting is the time the loop spends in
the checkpoint path between steps, less its device programs (the copies and the sum),
which a CPU runs in the host's time and an accelerator behind the steps: those are
timed apart. So is the last step's own checkpoint, which waits for the previous one
after training, before the final evaluation.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from unittest import mock

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import flags
from ml_collections import config_flags

from transformer_jax import checkpoint, cli, config as config_lib, partitioning
from transformer_jax.training import averaging, compilation, run as run_lib, saving

FLAGS = flags.FLAGS


class _CommitAt:
  """An Orbax commit future that completes at a given time (the throttled store's)."""

  def __init__(self, at: float):
    self.at = at

  def result(self, timeout: float | None = None) -> None:
    time.sleep(max(0.0, self.at - time.monotonic()))

  def cancel(self) -> None:
    pass


def throttled_store(bytes_per_s: float):
  """Orbax's saves (StandardSave) commit no sooner than their bytes at this rate: a
  patch of its handler, for a `with`."""
  original = ocp.StandardCheckpointHandler.async_save

  async def async_save(self, directory, *args, **kwargs):
    begun = time.monotonic()
    futures = await original(self, directory, *args, **kwargs) or []
    size = sum(x.nbytes for x in jax.tree.leaves(kwargs["args"].item))
    return [*futures, _CommitAt(begun + size / bytes_per_s)]
  return mock.patch.object(ocp.StandardCheckpointHandler, "async_save", async_save)


@contextlib.contextmanager
def device_work_timed():
  """Times the checkpoint path's device programs (the state's copy for a save in the
  background, the running sum), each waited for: on a CPU they run in the host's time,
  on an accelerator they queue behind the step. Yields a list holding the seconds."""
  spent = [0.0]
  def timed(fn):
    def call(*args):
      start = time.perf_counter()
      out = jax.block_until_ready(fn(*args))
      spent[0] += time.perf_counter() - start
      return out
    return call
  with mock.patch.multiple(averaging, copy_on_devices=timed(averaging.copy_on_devices),
                           add_in_place=timed(averaging.add_in_place)):
    yield spent


def scaled_state(cfg: config_lib.Config, scale: float):
  """The config's train state as zeros, each array's first axis times `scale`."""
  mesh = partitioning.make_mesh((1,) * len(config_lib.MESH_AXES), jax.devices()[:1])
  _, abstract = run_lib.make_run(cfg, mesh, abstract=True)
  shape = lambda s: (max(1, round(s[0] * scale)), *s[1:]) if s else s
  return jax.tree.map(lambda x: jax.device_put(np.zeros(shape(x.shape), x.dtype),
                                               x.sharding), abstract)


def time_window(cfg: config_lib.TrainConfig, state, directory: str, step_s: float
                ) -> tuple[float, float, int, int]:
  """Runs the window's steps through the checkpoint path. Returns the seconds waited
  between steps (device programs included), the seconds the last step's checkpoint
  waited, the steps, and the checkpoints written."""
  average = averaging.Window.of(cfg)
  first = average.steps[0] - cfg.checkpoint_every_steps + 1
  ckpt = checkpoint.manager(directory, keep=2)
  saver = saving.Saver(ckpt, directory, cfg, average)
  waited = []
  for done in range(first, cfg.num_train_steps + 1):
    time.sleep(step_s)  # The step, on the device.
    stepped = state.replace(step=jax.device_put(np.int32(done), state.step.sharding))
    start = time.perf_counter()
    average.add(done, stepped.params)
    saver.after_step(done, stepped)
    waited.append(time.perf_counter() - start)
  saver.wait()
  return sum(waited[:-1]), waited[-1], len(waited), saver.saved


def main():
  vocab = FLAGS.config.data.vocab_size
  cfg = config_lib.with_vocab(config_lib.parse(FLAGS.config), vocab)
  if cfg.train.average_last < 2:
    cli.fail(f"train.average_last={cfg.train.average_last}: this config averages no "
             "checkpoints, so it has no window to time; set it to 2 or more.")
  state = scaled_state(cfg, FLAGS.scale)
  size = lambda tree: sum(x.nbytes for x in jax.tree.leaves(tree)) / 1e9
  bandwidth = FLAGS.store_mb_per_s * 1e6 * FLAGS.scale
  print(f"JAX {jax.__version__}, {jax.devices()[0].device_kind}: train state of "
        f"{size(state):.2f} GB (--scale={FLAGS.scale:g}), +{size(state.params):.2f} GB "
        f"for the running sum inside the window; store at {bandwidth / 1e6:.0f} MB/s; "
        f"steps of {FLAGS.step_ms:g} ms; a checkpoint due every "
        f"{cfg.train.checkpoint_every_steps} steps, {cfg.train.average_last} averaged")
  compilation.compile_ahead(averaging.programs(cfg.train, state))  # As the loop does.
  with tempfile.TemporaryDirectory(dir=FLAGS.dir) as directory, \
      throttled_store(bandwidth), device_work_timed() as device:
    waited, final, steps, saves = time_window(cfg.train, state, directory,
                                              FLAGS.step_ms / 1e3)
  training, host = steps * FLAGS.step_ms / 1e3, waited - device[0]
  print(f"waiting on checkpoints: {100 * host / training:.2f}% of the training time of "
        f"the window's {steps:,} steps ({host:.2f} s of {training:.1f} s), {saves} "
        "checkpoints written")
  print(f"and {device[0]:.2f} s ({100 * device[0] / training:.2f}%) of device programs "
        "(the state copied for each save, the running sum's adds), in the host's time on "
        "a CPU; on an accelerator they queue behind the steps (memory speed)")
  print(f"after the last step, its checkpoint waited {final:.1f} s for the previous one "
        "(before the final evaluation; no step waits on it)")


def define_flags() -> None:
  config_flags.DEFINE_config_file("config", None, "Config file (as for main).",
                                  lock_config=True)
  flags.DEFINE_float("step_ms", 12.0, "Time of a train step (big on a v5p-64: about 12).")
  flags.DEFINE_float("store_mb_per_s", 200.0, "Bandwidth of the checkpoint store.")
  flags.DEFINE_float("scale", 1.0, "Shrink the state (each array's first axis) and the "
                     "bandwidth by this factor, to fit a smaller machine.")
  flags.DEFINE_string("dir", None, "Where the checkpoints are written (a temporary "
                      "folder in it, removed after); default: the system's.")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
