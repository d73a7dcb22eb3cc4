"""This project's train step beside its peers' (transformer_jax/benchmarks/peers.py): the
same batches timed the same way, and the Flax example's train.py imported without its
data pipeline. The whole job runs in tests/launch/test_bundle.py, on the image's Python."""

import sys

import numpy as np
import pytest

from transformer_jax.benchmarks import peers, timing


def test_each_shape_and_the_warmup_run_untimed_then_real_tokens_count():
  batches = [{"inputs": np.ones((2, n)), "targets": np.array([[5] * n, [5] + [0] * (n - 1)])}
             for n in (4, 8, 4, 4, 8)]
  calls, syncs = [], []
  timed = timing.time_steps(lambda b: calls.append(b["inputs"].shape[1]), batches, steps=3,
                            warmup_steps=1, sync=lambda: syncs.append(len(calls)))
  assert calls == [4, 8, 4, 8, 4, 4]  # One of each shape, the warm-up, then 3 timed.
  assert syncs == [3, 4, 5, 6]  # The device waited for before each timing and after.
  assert timed["steps"] == 3
  real = (8 + 1) + (4 + 1) + (4 + 1)  # batches[1:4]: non-pad target tokens.
  assert timed["tokens_per_s"] * timed["seconds"] == pytest.approx(real)


def test_the_ratio_is_ours_over_the_peers_so_above_one_means_faster():
  rows = peers.with_ratios({"this project": {"tokens_per_s": 300.0},
                            "flax_wmt": {"tokens_per_s": 100.0},
                            "pytorch": {"tokens_per_s": 600.0},
                            "broken": {"skipped": "torch is not installed"}})
  assert rows["flax_wmt"]["ours_over_it"] == pytest.approx(3.0)  # We are 3x faster.
  assert rows["pytorch"]["ours_over_it"] == pytest.approx(0.5)  # It is twice as fast.
  assert rows["this project"]["ours_over_it"] == 1.0
  assert "ours_over_it" not in rows["broken"]


def test_the_flax_example_imports_without_its_pipeline_and_leaves_nothing_behind(tmp_path):
  (tmp_path / "models.py").write_text("NAME = 'models'\n")
  (tmp_path / "decode.py").write_text("NAME = 'decode'\n")
  (tmp_path / "train.py").write_text(
      "import bleu, decode, input_pipeline, models\nimport tensorflow as tf\n"
      "from clu import metric_writers, periodic_actions\n"
      "def evaluate(ds: tf.data.Dataset): return ds\n")
  train = peers.load_flax_wmt(str(tmp_path))
  assert train.models.NAME == "models" and train.decode.NAME == "decode"
  assert not {"models", "decode", "input_pipeline", "bleu"} & set(sys.modules)
  for name in ("tensorflow", "clu", "clu.metric_writers"):  # Real ones, or none.
    assert getattr(sys.modules.get(name), "__spec__", True), name
  assert str(tmp_path) not in sys.path
