"""TensorBoard events written without TensorFlow (transformer_jax/summaries.py), as a clu
MetricWriter: clu's writers compose with it, and TensorBoard reads what it wrote."""

import numpy as np
import pytest
from clu import metric_writers
from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.util import tensor_util

from transformer_jax import summaries


def test_clu_writers_compose_with_it_and_tensorboard_reads_every_kind(tmp_path):
  events = summaries.SummaryWriter(tmp_path)
  assert isinstance(events, metric_writers.MetricWriter)
  writer = metric_writers.AsyncMultiWriter([events, metric_writers.LoggingWriter()])
  writer.write_scalars(3, {"eval/bleu": 27.25, "eval/loss": 1.5})
  writer.write_scalars(7, {"eval/bleu": 28.5})
  writer.write_texts(7, {"samples": "Ein Mann fährt Fahrrad."})
  writer.write_histograms(7, {"lengths": np.arange(100)})
  writer.write_hparams({"model.d_model": 512, "data.task": "multi30k"})
  writer.flush()
  writer.close()
  acc = ea.EventAccumulator(str(tmp_path), size_guidance={ea.TENSORS: 0})
  acc.Reload()
  value = lambda e: tensor_util.make_ndarray(e.tensor_proto)
  assert [(e.step, float(value(e))) for e in acc.Tensors("eval/bleu")] == [(3, 27.25),
                                                                            (7, 28.5)]
  assert acc.PluginTagToContent("scalars").keys() == {"eval/bleu", "eval/loss"}
  assert value(acc.Tensors("samples")[0]).item().decode() == "Ein Mann fährt Fahrrad."
  histogram = value(acc.Tensors("lengths")[0])  # [buckets, (left, right, count)]
  assert histogram[:, 2].sum() == 100 and histogram[0, 0] == 0 and histogram[-1, 1] == 99
  assert "_hparams_/session_start_info" in acc.Tags()["tensors"]


def test_what_needs_tensorflow_is_refused_by_name(tmp_path):
  writer = summaries.SummaryWriter(tmp_path)
  with pytest.raises(NotImplementedError, match="image summaries"):
    writer.write_images(1, {"x": np.zeros((1, 2, 2, 3))})
  writer.close()
