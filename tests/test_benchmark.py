"""The benchmark's arithmetic, and that both of its modes run and report."""

import os
import subprocess
import sys

import pytest

from configs import transformer as transformer_configs
from conftest import ROOT, newstest_standin
from transformer_jax import model
from transformer_jax import config as config_lib


def test_flops_per_token_match_the_usual_estimate():
  """6 N plus attention: base (V = 37k, N = 63M) costs about 381 MFLOP per target token,
  big (N = 214M) about 1.29 GFLOP, with about 216 d n for attention."""
  base, big = (config_lib.parse(transformer_configs.get_config(name)).model
               for name in ("base", "big"))
  assert model.train_flops_per_target_token(base, 63e6, 25) == pytest.approx(381e6,
                                                                                 rel=0.01)
  assert model.train_flops_per_target_token(big, 214e6, 25) == pytest.approx(1.29e9,
                                                                                 rel=0.01)
  attention = model.train_flops_per_target_token(base, 0, 25)
  assert attention == 216 * 512 * 25


def _run_benchmark(*flags, devices=1, **env):
  env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
         **env}
  return subprocess.run(
      [sys.executable, "-m", "transformer_jax.benchmark",
       "--config=configs/transformer.py:numbers", "--config.data.vocab_size=500",
       "--config.data.max_length=64", *flags],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _benchmark(tmp_path, *flags, devices=1):
  newstest = newstest_standin(tmp_path / "newstest")  # Generated; the timings are not the point.
  out = _run_benchmark(f"--newstest_dir={newstest}", *flags, devices=devices)
  assert out.returncode == 0, out.stderr[-3000:]
  return out.stdout


def test_offline_without_newstest_dir_is_one_clear_line(tmp_path):
  """No network (a proxy that refuses) and no --newstest_dir: say what to do instead."""
  out = _run_benchmark("--steps=1", SACREBLEU=str(tmp_path), https_proxy="http://127.0.0.1:9",
                       HTTPS_PROXY="http://127.0.0.1:9")
  assert out.returncode == 2  # cli.EXIT_INPUT
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith("error: could not download newstest2014") and "--newstest_dir" in last


@pytest.mark.slow
def test_benchmark_reports_throughput_mfu_memory_and_decoding(tmp_path):
  out = _benchmark(tmp_path, "--steps=2", "--decode_sentences=8", "--config.decode.batch_size=8")
  for expected in ("non-pad target tokens/s", "MFU", "measured (4096^3 float32 matmul)",
                   "GiB host peak RSS", "random weights, beam 4", "compiling"):
    assert expected in out, out
  decode = out[out.index("random weights, beam 4"):]
  assert "sentences/s" in decode and "target tokens/s" in decode, out


@pytest.mark.slow
def test_ahead_of_time_compile_reports_memory_per_device(tmp_path):
  out = _benchmark(tmp_path, "--aot", "--config.train.mesh_shape=(2,2,2)", devices=8)
  assert "mesh {'data': 2, 'fsdp': 2, 'tensor': 2}" in out
  assert "memory per device: arguments" in out and "temporaries" in out
