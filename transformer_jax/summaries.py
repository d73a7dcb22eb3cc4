"""TensorBoard event files, written without TensorFlow, and read back (`read_scalars`,
TensorBoard's own loader: launch.results and searches read the runs' metrics with it).

The events are TensorBoard's own protos in its record format (the pieces that its
framework-free `tensorboard.summary.Writer` and PyTorch's writer use), written to a
file opened through `etils.epath`: a local workdir needs no TensorFlow, and a gs://
one reaches the bucket the way every other file of the run does (`files.py`).
Scalars are also logged, one line per write. (Not a clu `MetricWriter`: importing
`clu.metric_writers` imports TensorFlow, which a run needs nowhere else.)
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import time
from typing import Any, Mapping

import numpy as np
from etils import epath
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.hparams import summary_v2 as hparams_summary
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.summary.writer.record_writer import RecordWriter
from tensorboard.util import tensor_util

from transformer_jax import files

_file_ids = itertools.count()  # Two writers of one process in one second differ.


class SummaryWriter:
  """Scalars and hyperparameters for TensorBoard; `write_events=False` only logs.

  Every write is flushed, so TensorBoard (and a preempted run's last window) sees it.
  """

  def __init__(self, logdir: epath.PathLike, write_events: bool = True):
    self._files = contextlib.ExitStack()
    self._file = self._records = self._path = None
    if write_events:
      logdir = epath.Path(logdir)
      logdir.mkdir(parents=True, exist_ok=True)
      name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
              f"{os.getpid()}.{next(_file_ids)}")
      self._path = logdir / name
      # A context manager: for gs:// (tf.io.gfile), open() returns no plain file.
      self._file = self._files.enter_context(self._path.open("wb"))
      self._records = RecordWriter(self._file)
      self._write(event_pb2.Event(file_version="brain.Event:2"))

  def _write(self, event: event_pb2.Event) -> None:
    if self._records is not None:
      event.wall_time = time.time()
      with files.naming(self._path):  # A full disk names the events file.
        self._records.write(event.SerializeToString())
        self._file.flush()

  def write_scalars(self, step: int, scalars: Mapping[str, Any], log: bool = True) -> None:
    if log:
      logging.info("[%d] %s", step, ", ".join(f"{k}={float(v):.6g}"
                                              for k, v in sorted(scalars.items())))
    summary = summary_pb2.Summary()
    for tag, value in scalars.items():
      summary.value.add(tag=tag, tensor=tensor_util.make_tensor_proto(np.float32(value)),
                        metadata=scalar_metadata.create_summary_metadata(tag, ""))
    self._write(event_pb2.Event(step=int(step), summary=summary))

  def write_hparams(self, hparams: Mapping[str, bool | int | float | str]) -> None:
    """The hyperparameters, for TensorBoard's HPARAMS tab."""
    self._write(event_pb2.Event(summary=hparams_summary.hparams_pb(dict(hparams))))

  def close(self) -> None:
    self._files.close()
    self._file = self._records = None


def read_scalars(workdir: str) -> dict[str, list[tuple[int, float, float]]]:
  """{tag: [(step, value, wall_time), ...]} from a workdir's event files."""
  from tensorboard.backend.event_processing import event_accumulator as ea
  from tensorboard.util import tensor_util

  if not epath.Path(workdir).is_dir():
    return {}
  acc = ea.EventAccumulator(workdir, size_guidance={ea.TENSORS: 0})
  acc.Reload()
  out = {}
  for tag in acc.Tags()["tensors"]:
    events = acc.Tensors(tag)
    try:
      out[tag] = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)), e.wall_time)
                  for e in events]
    except (TypeError, ValueError):  # Non-scalar summaries (hyperparameters).
      continue
  return out
