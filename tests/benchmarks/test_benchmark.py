"""The benchmark's arithmetic, and that both of its modes run and report."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from configs import transformer as transformer_configs
from conftest import ROOT, SHARED_DATA, newstest_standin, xla_flags
from transformer_jax import config as config_lib
from transformer_jax.benchmarks import phases as phases_lib, workload
from transformer_jax.data import batching
from transformer_jax.model import transformer
from transformer_jax.planning import roofline, topology

SHARED_NEWSTEST = os.path.join(SHARED_DATA, "newstest2014")


def test_flops_per_token_match_the_usual_estimate():
  """6 N plus attention: base (V = 37k, N = 63M) costs about 381 MFLOP per target token,
  big (N = 214M) about 1.29 GFLOP, with about 216 d n for attention."""
  base, big = (config_lib.parse(transformer_configs.get_config(name)).model
               for name in ("base", "big"))
  assert transformer.train_flops_per_target_token(base, 63e6, 25) == pytest.approx(381e6,
                                                                                 rel=0.01)
  assert transformer.train_flops_per_target_token(big, 214e6, 25) == pytest.approx(1.29e9,
                                                                                 rel=0.01)
  attention = transformer.train_flops_per_target_token(base, 0, 25)
  assert attention == 216 * 512 * 25


@pytest.mark.parametrize("kind, tflops", [
    ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0),
    ("NVIDIA H100 NVL", 835.0), ("NVIDIA H200", 989.0), ("NVIDIA A100-SXM4-80GB", 312.0),
    ("TPU v4", 275.0), ("TPU v5 lite", 197.0), ("TPU v5", 459.0), ("TPU v6 lite", 918.0),
    ("NVIDIA H100 HBM4 Refresh", None), ("NVIDIA L4", None)])
def test_peaks_come_from_each_device_kinds_datasheet_or_are_unknown(kind, tflops):
  """An H100 PCIe or NVL is not an SXM's 989 TFLOP/s; an unlisted kind has no guess."""
  sheet = topology.datasheet_peak(kind)
  assert (sheet and sheet[0]) == tflops


@pytest.mark.skipif(not os.path.exists(SHARED_NEWSTEST), reason="needs ../shared/data")
@pytest.mark.parametrize("count", ["real", "padded"])
def test_base_batches_at_newstest_lengths_are_mostly_real_tokens(count):
  """An epoch of batches of 100k pairs resampled at newstest2014's lengths fills its
  length buckets as WMT's do: at least 80% of base's computed target positions, over the
  epoch (rows padded to 8 data shards included), are real tokens, whichever way the
  budget counts (a batch of the 3,003 lines alone is about half padding)."""
  cfg = config_lib.parse(transformer_configs.get_config("base"))
  lengths = workload.newstest_lengths(cfg.data.vocab_size, SHARED_NEWSTEST)
  assert len(lengths) == 3003
  data = workload.realistic_data(cfg.data.vocab_size, cfg.data.max_length, lengths,
                                  100_000)
  train = dataclasses.replace(cfg.train, batch_tokens_count=count)
  batches = [batching.train_batch(data, k, train, cfg.data.max_length, 8)
             for k in range(batching.steps_per_epoch(data, train))]
  real = sum(int((b["targets"] != 0).sum()) for b in batches)
  fraction = real / sum(b["targets"].size for b in batches)
  assert 0.8 <= fraction < 1.0, fraction


def _run_benchmark(*flags, devices=1, **env):
  env = {**os.environ, "XLA_FLAGS": xla_flags(devices),
         **env}
  return subprocess.run(
      [sys.executable, "-m", "transformer_jax.benchmark",
       "--config=configs/transformer.py:numbers,smoke", "--config.data.vocab_size=500",
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
  """The figures, not only their labels: positive and finite, MFU a fraction."""
  import math
  run = _run_benchmark(f"--newstest_dir={newstest_standin(tmp_path / 'newstest')}",
                       "--steps=2", "--decode_sentences=8", "--config.decode.batch_size=8",
                       "--json")
  assert run.returncode == 0, run.stderr[-3000:]
  figures, out = json.loads(run.stdout), run.stderr  # The report goes to stderr.
  for key in ("tokens_per_s", "step_s", "mfu", "mfu_computed", "peak_memory_gib",
              "decode_s", "real_token_fraction"):
    assert isinstance(figures[key], float) and math.isfinite(figures[key]), (key, figures)
    assert figures[key] > 0, (key, figures)
  assert 0 < figures["mfu"] <= figures["mfu_computed"] < 1
  assert 0 < figures["real_token_fraction"] <= 1
  assert figures["decode_sentences"] == 8 and figures["steps"] == 2
  for expected in ("non-pad target tokens/s", "MFU", "measured (2048^3 float32 matmul)",
                   "GiB host peak RSS", "each runs to its length limit), beam 2", "compiling",
                   "real tokens", "on computed positions", "10th-90th percentile"):
    assert expected in out, out


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(SHARED_NEWSTEST), reason="needs ../shared/data")
def test_json_figures_and_a_profile_on_real_newstest_with_a_tiny_vocabulary(tmp_path):
  """--json: one object on stdout with the documented keys; --profile_dir: a trace and
  its top operations. The numbers config's 100-piece vocabulary is smaller than
  newstest2014's alphabet, which must not matter for its lengths."""
  out = subprocess.run(
      [sys.executable, "-m", "transformer_jax.benchmark",
       "--config=configs/transformer.py:numbers,smoke", f"--newstest_dir={SHARED_NEWSTEST}",
       "--steps=5", "--pairs=5000", "--decode_sentences=8", "--repeats=1",
       "--config.decode.batch_size=8", "--json", f"--profile_dir={tmp_path / 'trace'}"],
      cwd=ROOT, capture_output=True, text=True, timeout=600,
      env={**os.environ, "XLA_FLAGS": xla_flags(1)})
  assert out.returncode == 0, out.stderr[-3000:]
  figures = json.loads(out.stdout)
  for key in ("device_kind", "jax_version", "config", "tokens_per_s", "step_s",
              "real_token_fraction", "mfu", "mfu_computed", "peak_memory_gib",
              "decode_sentences", "decode_s", "top_ops"):
    assert figures.get(key) is not None, key
  assert figures["decode_sentences"] == 8 and figures["steps"] == 5
  assert figures["step_s_p10"] <= figures["step_s"] <= figures["step_s_p90"]
  assert 0 < figures["real_token_fraction"] <= 1 and figures["mfu"] < figures["mfu_computed"]
  assert figures["top_ops"] and os.path.exists(tmp_path / "trace" / "plugins")
  assert figures["recompiled"] == []  # Train shapes and beam search compiled once, ahead.
  # Random weights never choose EOS: every output runs past its source by
  # decode.max_extra_length (the worst case), rather than stopping where weights fell.
  extra = transformer_configs.get_config("numbers,smoke").decode.max_extra_length
  assert figures["decode_target_tokens"] >= 8 * (extra + 1), figures["decode_target_tokens"]
  assert {p["status"] for p in figures["phases"].values()} == {"ok"}
  assert list(figures["phases"]) == ["init", "compile", "train", "decode", "profile"]
  split = figures["breakdown"]  # The largest batch's step, by category.
  rows = split["categories"]
  assert set(rows) == {*roofline.CATEGORIES, "not in the program", "idle"}
  assert sum(r["ms"] for r in rows.values()) == pytest.approx(
      split["step_ms"] + split["overlap_ms"])
  assert rows["matrix products"]["ms"] > 0 and rows["matrix products"]["floor_ms"] > 0
  assert rows["not in the program"]["ms"] < 0.2 * split["step_ms"]  # Joined by hlo_op.
  assert split["flops_per_s"] > 0 and split["bytes_per_s"] > 0


@pytest.mark.slow
def test_a_failing_phase_keeps_what_was_measured_and_a_budget_skips_the_rest(tmp_path):
  """--results is written after every phase: a profile that cannot write its trace
  (the folder is a file) fails alone, recorded with its error, and the training and
  decoding figures stay (exit 1); nothing compiles twice after the ahead-of-time pass.
  With --budget_s=0, only the first phase runs and the others are recorded as skipped."""
  blocked = tmp_path / "not_a_folder"
  blocked.write_text("")
  results = tmp_path / "results.json"
  out = _run_benchmark(f"--newstest_dir={newstest_standin(tmp_path / 'news')}", "--steps=2",
                       "--decode_sentences=8", "--config.decode.batch_size=8",
                       "--repeats=0", f"--profile_dir={blocked}", f"--results={results}")
  assert out.returncode == 1, out.stderr[-3000:]
  figures = json.loads(results.read_text())
  phases = figures["phases"]
  assert {n: p["status"] for n, p in phases.items()} == {
      "init": "ok", "compile": "ok", "train": "ok", "decode": "ok", "profile": "error"}
  assert "Error" in phases["profile"]["error"] and phases["train"]["seconds"] > 0
  assert figures["tokens_per_s"] > 0 and figures["decode_sentences"] == 8
  assert figures["peak_memory_gib"] > 0 and figures["ended"]
  assert figures["recompiled"] == [], figures["recompiled"]
  assert figures["provenance"]["versions"]["jax"] == figures["jax_version"]

  out = _run_benchmark(f"--newstest_dir={tmp_path / 'news'}", "--steps=2",
                       "--budget_s=0", f"--results={results}")
  phases = json.loads(results.read_text())["phases"]
  assert out.returncode == 0 and phases["init"]["status"] == "ok", out.stderr[-3000:]
  assert {phases[n]["status"] for n in ("compile", "train")} == {"skipped"}


def test_a_spent_budget_starts_no_compile_but_still_measures_what_compiled():
  """--budget_s: once it is spent no compile starts, but a phase that only runs what is
  compiled (train, decode, profile) does: a long compile is not paid for nothing (a
  fresh H100 once compiled for 134 s, then skipped the seconds of training)."""
  figures = {}
  phases = phases_lib.Phases(figures, budget_s=0.0)
  assert phases.run("compile", lambda: "compiled") == "compiled"  # The first runs.
  assert phases.run("train", lambda: "timed", needs=["compile"], measures=True) == "timed"
  assert phases.run("compile_more", lambda: "compiled") is None
  assert figures["phases"]["compile_more"] == {"status": "skipped",
                                               "why": "time budget of 0 s spent"}


@pytest.mark.slow
def test_compiled_programs_are_kept_in_a_per_user_cache_by_default(tmp_path):
  """With no JAX_COMPILATION_CACHE_DIR, every command keeps its compiled programs under
  ~/.cache/transformer_jax/compilation; --compilation_cache=off keeps none."""
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
  def compile_with(home, *flags):
    out = subprocess.run(
        [sys.executable, "-m", "transformer_jax.benchmark",
         "--config=configs/transformer.py:numbers,smoke", "--aot", *flags], cwd=ROOT,
        env={**env, "HOME": str(home), "XDG_CACHE_HOME": "",
             "XLA_FLAGS": xla_flags(1)},
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
  compile_with(tmp_path / "on")
  assert os.listdir(tmp_path / "on" / ".cache" / "transformer_jax" / "compilation")
  compile_with(tmp_path / "off", "--compilation_cache=off")
  assert not os.path.exists(tmp_path / "off" / ".cache" / "transformer_jax")


@pytest.mark.slow
def test_ahead_of_time_compile_reports_memory_per_device(tmp_path):
  out = _benchmark(tmp_path, "--aot", "--config.train.mesh_shape=(2,2,2)", devices=8)
  assert "mesh {'data': 2, 'fsdp': 2, 'tensor': 2}" in out
  assert "memory per device: arguments" in out and "temporaries" in out


def test_random_weights_decode_without_eos_to_the_length_limit():
  """workload.without_eos: EOS's logit is 0 for any decoder state (beam search never
  picks it from random weights' logits, so outputs run to the length limit); every
  other weight is unchanged, and the shardings too (the compiled programs fit)."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from conftest import smoke_config
  from transformer_jax import partitioning
  from transformer_jax.training import run as run_lib
  from transformer_jax.data.tokenizer import EOS_ID
  run, state = run_lib.make_run(smoke_config(), partitioning.make_mesh(
      (1, 1, 1), jax.devices()[:1]))
  params = workload.without_eos(state.params)
  inputs = jnp.array([[5, 9, 4, 7]])  # No EOS: its embedding (shared) is zeroed too.
  logits = run.model.apply({"params": params}, inputs, inputs)
  assert (np.asarray(logits[..., EOS_ID]) == 0).all()
  before = run.model.apply({"params": state.params}, inputs, inputs)
  assert (np.asarray(before[..., EOS_ID]) != 0).all()
  np.testing.assert_array_equal(np.delete(np.asarray(logits), EOS_ID, axis=-1),
                                np.delete(np.asarray(before), EOS_ID, axis=-1))
  assert jax.tree.map(lambda x: x.sharding, params) == jax.tree.map(lambda x: x.sharding,
                                                                    state.params)


def test_the_checkpoint_benchmark_times_a_window_through_the_loops_saves(tmp_path):
  """benchmarks/checkpointing on the smoke model: a window of 3 snapshots 5 steps apart
  (15 steps) with checkpoints deferred, on a store far slower than the steps: it prints
  the share spent waiting and the checkpoints written; a config that averages nothing
  is one line."""
  command = [sys.executable, "-m", "transformer_jax.benchmarks.checkpointing",
             "--config=configs/transformer.py:numbers,smoke", "--step_ms=5",
             "--store_mb_per_s=2", f"--dir={tmp_path}"]
  env = {**os.environ, "XLA_FLAGS": xla_flags(1), "JAX_PLATFORMS": "cpu"}
  out = subprocess.run([*command, "--config.train.average_last=3",
                        "--config.train.checkpoint_every_steps=5",
                        "--config.train.defer_checkpoints=True"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  waiting = [line for line in out.stdout.splitlines() if "waiting on checkpoints" in line]
  assert len(waiting) == 1 and "% of the training time of the window's 15 steps" in \
      waiting[0], out.stdout
  assert 1 <= int(waiting[0].split(" checkpoints written")[0].split()[-1]) <= 4, waiting
  assert os.listdir(tmp_path) == []  # Its checkpoints removed.
  refused = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300)
  assert refused.returncode == 2 and "train.average_last=1" in refused.stderr.splitlines()[-1]
