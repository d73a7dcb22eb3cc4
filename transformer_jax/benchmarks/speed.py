r"""Measure training and decoding speed, MFU and memory; or compile ahead of time.

  python -m transformer_jax.benchmark --config=configs/transformer.py:base \
      --config.model.dtype=bfloat16 [--steps=20] [--decode_sentences=3003] [--json]
  python -m transformer_jax.benchmark --config=configs/transformer.py:big --aot \
      --config.train.mesh_shape="(1,8,1)"   # Memory per device, without running.
  python -m transformer_jax.benchmark --config=configs/transformer.py:big \
      --config.model.dtype=bfloat16 --topology=v5p-64   # For a TPU slice, here (libtpu).
  python -m transformer_jax.benchmark --config=configs/transformer.py:big \
      --config.model.dtype=bfloat16 --topology=8xH100   # For 8 GPUs, here (CUDA plugin).
  python -m transformer_jax.benchmark --workdir=runs/m30k [--split=test]  # Decoding only.

Batches are drawn as training draws them from --pairs sentence pairs (default 100,000)
whose lengths are resampled from newstest2014 EN-DE (the paper's test set; sacreBLEU
downloads it, or --newstest_dir names a local copy), tokenized with a BPE model trained
on it (vocabulary min(max(data.vocab_size, 1000), 8000)); token ids are random (speed
does not depend on them). With that many pairs the length buckets fill as WMT's do, so
the real-token fraction is WMT's, not that of a 3,003-line set.

Reported: the median step time and its spread over --steps timed steps (after one
compile per batch shape and --warmup_steps more); real (non-pad) target tokens/s; the
real-token fraction of the computed target positions; MFU on real tokens and on
computed positions (`mfu_computed`, padding counted as work); peak memory. FLOPs per
token = 6 x parameters + attention (model.train_flops_per_target_token). Peaks per
device kind come from the vendors' datasheets (dense bfloat16; topology.PEAK_TFLOPS); an
unlisted accelerator reports "unknown peak" (give --peak_tflops); on a CPU the peak
is measured in the same run with a large matrix product. --profile_dir writes a
jax.profiler trace of a few steps there and reports the operations that took the most
time.

A run goes in phases (init, compile, train, decode, profile): every program the later
phases run is compiled first, in parallel threads, under the run's mesh, so none
compiles twice (`recompiled` in --json lists any that did). --results=FILE gets the
figures, with each phase's seconds and status (an error is recorded, and the phases
that do not need the failed one go on), when the run starts and after every phase;
--budget_s starts no compile after that many seconds (train, decode and profile, which
run what is already compiled, still start). The figures also say what ran
(`provenance`: package versions, backend, cuDNN, devices, driver, command).

Decoding (beam search with the config's decode settings) is timed twice: with random
weights at newstest2014 lengths (EOS never chosen, so every output runs to its length
limit: the worst case), and, with --workdir, for a trained run's latest checkpoint on a
real split, with its sacreBLEU. Each reports the first pass (which compiles one program
per source width) and the best of --repeats later passes. --compare_rev=REV decodes the same sentences
with the same weights using the code of an earlier git revision (extracted with `git
archive`, run in a subprocess) and prints the speed-up and how many outputs agree.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import glob
import gzip
import json
import os
import resource
import sys
import tempfile
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import sacrebleu.utils
from absl import flags
from ml_collections import config_flags

from transformer_jax import cli, config as config_lib, partitioning
from transformer_jax.benchmarks import aot, decoding, topology
from transformer_jax.benchmarks.phases import failed, Phases, provenance
from transformer_jax.benchmarks.topology import datasheet_peak
from transformer_jax.data import batching, corpora, tokenizer
from transformer_jax.data.tokenizer import EOS_ID
from transformer_jax.model import attention, transformer as model_lib
from transformer_jax.training import compilation, run as run_lib
from transformer_jax.training.step import TrainState

FLAGS = flags.FLAGS

def device_peak_flops(dtype: str, peak_tflops: float | None = None
                      ) -> tuple[float | None, str]:
  """(per-device peak FLOP/s or None if unknown, where the number came from)."""
  if peak_tflops:
    return peak_tflops * 1e12, "--peak_tflops"
  device = jax.devices()[0]
  if sheet := datasheet_peak(device.device_kind):
    return sheet[0] * 1e12, f"{sheet[1]}, dense bf16"
  if device.platform != "cpu":
    return None, f"unknown peak for {device.device_kind!r} (give --peak_tflops)"
  n = 4096  # A CPU: measure a large matrix product now.
  a = jnp.ones((n, n), jnp.dtype(dtype))
  product = jax.jit(lambda x: x @ x)
  product(a).block_until_ready()
  start = time.perf_counter()
  for _ in range(5):
    out = product(a)
  out.block_until_ready()
  return 5 * 2 * n**3 / (time.perf_counter() - start), f"measured ({n}^3 {dtype} matmul)"


def peak_memory_bytes() -> tuple[int, str]:
  stats = jax.devices()[0].memory_stats()
  if stats and "peak_bytes_in_use" in stats:
    return stats["peak_bytes_in_use"], "device peak"
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "host peak RSS"


def newstest2014(directory: str | None) -> tuple[list[str], list[str]]:
  """newstest2014 EN-DE (3,003 lines) from `directory`, or downloaded by sacreBLEU."""
  if directory:
    return (corpora.read_lines(os.path.join(directory, "newstest2014.en")),
            corpora.read_lines(os.path.join(directory, "newstest2014.de")))
  try:
    source = sacrebleu.utils.get_source_file("wmt14/full", "en-de")
    reference, = sacrebleu.utils.get_reference_files("wmt14/full", "en-de")
  except OSError as e:
    raise FileNotFoundError(
        f"could not download newstest2014 (sacreBLEU test set wmt14/full): {e}. Offline, "
        "pass --newstest_dir=DIR holding newstest2014.en and newstest2014.de.") from None
  return corpora.read_lines(source), corpora.read_lines(reference)


def newstest_lengths(vocab_size: int, newstest_dir: str | None) -> list[tuple[int, int]]:
  """(source, target) token counts of newstest2014's pairs, EOS included."""
  en, de = newstest2014(newstest_dir)
  with tempfile.TemporaryDirectory() as tmp:
    tok = tokenizer.load_or_train(os.path.join(tmp, "spm.model"), en + de,
                                  min(max(vocab_size, 1000), 8000), "bpe")
    return [(len(s), len(t)) for s, t in zip(tok.encode(en), tok.encode(de, target=True))]


def realistic_data(vocab_size: int, max_length: int, lengths: list[tuple[int, int]],
                   pairs: int) -> batching.ParallelData:
  """`pairs` pairs of random ids whose lengths are drawn (seeded, with replacement)
  from `lengths`, keeping those within max_length."""
  rng = np.random.default_rng(0)
  fits = np.array([(s, t) for s, t in lengths if max(s, t) <= max_length])
  drawn = fits[rng.integers(0, len(fits), pairs)]
  ids = lambda n: np.append(rng.integers(3, vocab_size, n - 1), 1).astype(np.int32)
  return batching.ParallelData([ids(s) for s, _ in drawn], [ids(t) for _, t in drawn])


def main():
  if (FLAGS.config is None) == (FLAGS.workdir is None):
    cli.fail("give exactly one of --config (training and random-weight decoding) and "
             "--workdir (decoding a trained run).")
  with contextlib.redirect_stdout(sys.stderr) if FLAGS.json else contextlib.nullcontext():
    if FLAGS.workdir:
      figures = decoding.benchmark_trained_decoding(
          FLAGS.workdir, FLAGS.split, FLAGS.repeats, FLAGS.compare_rev, FLAGS.ctranslate2)
    else:
      figures = benchmark_config(FLAGS.config)
  if FLAGS.json:
    print(json.dumps(figures, indent=1))
  if failed(figures):
    sys.exit(1)


def without_eos(params: Any) -> Any:
  """A copy of `params` (same shardings) whose output projection gives EOS a logit of
  0, in the middle of random weights' logits: beam search never ends a translation
  early, and decoding runs to each sentence's length limit (source length +
  decode.max_extra_length), the worst case, however the weights happened to fall."""
  def zero_eos(path, x):
    names = [getattr(k, "key", getattr(k, "name", "")) for k in path]
    if names[-2:] == ["embed", "embedding"]:  # Shared: the projection is its transpose.
      return x.at[EOS_ID].set(0)
    if names[-2:] == ["logits", "kernel"]:  # [d_model, vocab]
      return x.at[:, EOS_ID].set(0)
    return x
  shardings = jax.tree.map(lambda x: x.sharding, params)
  return jax.jit(lambda p: jax.tree_util.tree_map_with_path(zero_eos, p),
                 out_shardings=shardings)(params)


def benchmark_config(config) -> dict:
  """The benchmark of a config (flags as given); returns the figures for --json.

  Its phases, each recorded in the figures and in --results as it ends: init (the
  sharded train state), compile (every program the later phases run, in parallel,
  under the run's mesh), train (warm-up, then the timed steps; the peak memory after
  it is training's alone), decode (beam search on newstest2014 lengths), profile. A
  phase that fails is recorded with its error and the others go on where they can."""
  aot_only = FLAGS.aot or FLAGS.topology
  try:
    cfg = config_lib.parse(config)
    target = topology.parse(FLAGS.topology) if FLAGS.topology else None
    mesh = partitioning.make_mesh(cfg.train.mesh_shape,
                                  target.devices(FLAGS.num_slices) if target else None)
    lengths = None if aot_only else newstest_lengths(cfg.data.vocab_size,
                                                     FLAGS.newstest_dir)
  except (FileNotFoundError, ValueError, RuntimeError) as e:
    cli.fail(str(e).strip().splitlines()[-1] if isinstance(e, RuntimeError) else str(e))
  cfg = config_lib.with_vocab(cfg, cfg.data.vocab_size)  # No tokenizer: ids are random.
  device = mesh.devices.flat[0]
  figures = {"device_kind": device.device_kind, "devices": mesh.devices.size,
             "jax_version": jax.__version__,
             "config": " ".join(a for a in sys.argv[1:] if a.startswith("--config")),
             "dtype": cfg.model.dtype,
             "attention": attention.attention_implementation(cfg.model),
             "rng_impl": cfg.train.rng_impl, "mesh": dict(mesh.shape)}
  print(f"devices: {mesh.devices.size} x {device.device_kind}; "
        f"mesh {dict(mesh.shape)}; dtype {cfg.model.dtype}; attention "
        f"{figures['attention']}; dropout bits {cfg.train.rng_impl}")
  if aot_only:
    figures.update(aot.check(cfg, mesh, target))
    print("\n".join(aot.describe(figures)))
    if figures.get("fits") is False:
      cli.fail(aot.refusal(figures, aot.suggest(cfg, target, FLAGS.num_slices)))
    return figures
  figures.update(provenance=provenance(), started=_now())
  phases = Phases(figures, FLAGS.results, FLAGS.budget_s)
  made = phases.run("init", lambda: run_lib.make_run(cfg, mesh))
  if made is None:
    return _finish(phases)
  run, state = made
  live = {"state": state}  # Each train step donates the state it is given.
  profiled = 3 if FLAGS.profile_dir else 0  # Train steps traced.
  num_batches = max(FLAGS.warmup_steps + FLAGS.steps if FLAGS.steps else 0, profiled)
  data = (realistic_data(cfg.data.vocab_size, cfg.data.max_length, lengths, FLAGS.pairs)
          if num_batches else None)
  batches = [run.train_batch(data, k) for k in range(num_batches)]
  sources = []
  if FLAGS.decode_sentences:  # newstest2014 lengths, random ids: run to the length limit.
    news = realistic_data(cfg.data.vocab_size, cfg.model.max_len, lengths, len(lengths))
    sources = [news.inputs[i] for i in range(min(FLAGS.decode_sentences, len(news)))]
  shapes = list({b["inputs"].shape: {k: v.shape for k, v in b.items()}
                 for b in batches}.values())

  def compile_all():
    if sources:  # Its own copy: training donates the state's.
      live["decode_params"] = without_eos(live["state"].params)
    programs = [*compilation.train_programs(run, live["state"], shapes),
                *(compilation.decode_programs(run, live["decode_params"], sources, cfg.decode)
                  if sources else [])]
    start = time.perf_counter()
    with compilation.count_compiles() as compiled:
      compilation.compile_ahead(programs)
    live["ahead"] = compiled
    figures.update(compile_s=time.perf_counter() - start, programs=len(programs),
                   compiled_programs=sorted(c.name for c in compiled))
    print(f"compiled {len(programs)} programs ({len(shapes)} train step shapes, "
          f"{len(programs) - len(shapes)} beam search) in {figures['compile_s']:.1f} s")
  phases.run("compile", compile_all, needs=["init"])

  with compilation.count_compiles() as later:
    if FLAGS.steps:
      def train():
        live["state"], timed = benchmark_training(run, live["state"], batches, data,
                                                  FLAGS.steps, FLAGS.warmup_steps,
                                                  FLAGS.peak_tflops)
        figures.update(timed)
      phases.run("train", train, needs=["compile"], measures=True)
    if sources:
      def decode():
        with run.activate():
          outputs, seconds = decoding.benchmark_decoding(
              live["decode_params"], run.model, sources, cfg.decode,
              f"{len(sources)} newstest2014-length sentences, random weights (EOS "
              "never chosen: each runs to its length limit)",
              FLAGS.repeats, FLAGS.compare_rev, flax_wmt_dir=FLAGS.flax_wmt_dir)
        figures.update(decode_sentences=len(sources), decode_s=seconds,
                       decode_target_tokens=sum(len(o) + 1 for o in outputs),
                       decode_beam_size=cfg.decode.beam_size,
                       decode_peak_memory_gib=peak_memory_bytes()[0] / 2**30)
      phases.run("decode", decode, needs=["compile"], measures=True)
    if FLAGS.profile_dir:
      def profile():
        live["state"], figures["top_ops"] = profile_steps(
            run, live["state"], batches[:profiled], FLAGS.profile_dir)
      phases.run("profile", profile,
                 needs=["compile"] + (["train"] if FLAGS.steps else []), measures=True)
  figures["recompiled"] = compilation.recompiled(live.get("ahead", []), later)
  if figures["recompiled"]:
    print(f"compiled again after the ahead-of-time pass: {figures['recompiled']}")
  return _finish(phases)


def _now() -> str:
  return datetime.datetime.now().isoformat(timespec="seconds")


def _finish(phases: Phases) -> dict:
  phases.figures["ended"] = _now()
  phases.write()
  return phases.figures


def benchmark_training(run: run_lib.Run, state: TrainState,
                       batches: Sequence[dict[str, np.ndarray]],
                       data: batching.ParallelData, steps: int, warmup_steps: int = 2,
                       peak_tflops: float | None = None) -> tuple[TrainState, dict]:
  """Times `steps` train steps, one by one, after one step of each batch shape among
  `batches` (compiled ahead: compilation.train_programs) and `warmup_steps` more; returns
  the state after them (the one passed in is donated) and the figures, the peak memory
  among them (training's alone, when nothing else ran before)."""
  cfg = run.cfg
  num_params = sum(x.size for x in jax.tree.leaves(state.params))
  batches = batches[:warmup_steps + steps]
  step = lambda state, batch: run.train_step(
      state, partitioning.shard_batch(batch, run.mesh), run.dropout_key)
  with run.activate():
    warmup_start = time.perf_counter()
    one_of_each = {b["inputs"].shape: b for b in batches}.values()
    for batch in [*one_of_each, *batches[:warmup_steps]]:
      state, out = step(state, batch)
    jax.block_until_ready(out)
    warmup_seconds = time.perf_counter() - warmup_start
    seconds = []
    for batch in batches[warmup_steps:]:
      start = time.perf_counter()
      state, out = step(state, batch)
      jax.block_until_ready(out)
      seconds.append(time.perf_counter() - start)
  timed = batches[warmup_steps:]
  real = sum(int((b["targets"] != 0).sum()) for b in timed)
  computed = sum(b["targets"].size for b in timed)
  total = sum(seconds)
  flops = lambda length: model_lib.train_flops_per_target_token(cfg.model, num_params,
                                                                  length)
  mean_length = float(np.mean(data.targets.lengths))
  mean_width = float(np.mean([b["targets"].shape[1] for b in timed]))
  peak, peak_source = device_peak_flops(cfg.model.dtype, peak_tflops)
  memory, memory_source = peak_memory_bytes()
  mfu = (real / total * flops(mean_length) / (peak * jax.device_count())) if peak else None
  mfu_computed = (computed / total * flops(mean_width) / (peak * jax.device_count())
                  if peak else None)
  p10, median, p90 = np.percentile(seconds, [10, 50, 90])
  print(f"model: {num_params / 1e6:.1f}M parameters, {flops(mean_length) / 1e6:.0f} MFLOP "
        f"per target token (mean target length {mean_length:.1f})")
  print(f"train: {steps} steps of ~{cfg.train.batch_tokens} tokens per side in "
        f"{total:.2f} s (a step of each shape and {warmup_steps} warm-up steps "
        f"{warmup_seconds:.1f} s)")
  print(f"  step time median {median * 1e3:.1f} ms (10th-90th percentile "
        f"{p10 * 1e3:.1f}-{p90 * 1e3:.1f} ms); {real / total:,.0f} non-pad target "
        f"tokens/s; real tokens {100 * real / computed:.1f}% of computed positions; "
        f"{memory / 2**30:.2f} GiB {memory_source}")
  if peak:
    print(f"  MFU {100 * mfu:.1f}% on real tokens, {100 * mfu_computed:.1f}% on computed "
          f"positions, of {peak / 1e12:.2f} TFLOP/s per device, {peak_source}")
  else:
    print(f"  MFU: {peak_source}")
  return state, {
      "num_params": num_params, "steps": steps, "tokens_per_s": real / total,
      "step_s": float(median), "step_s_p10": float(p10), "step_s_p90": float(p90),
      "real_token_fraction": real / computed, "mfu": mfu, "mfu_computed": mfu_computed,
      "peak_tflops": peak / 1e12 if peak else None, "peak_source": peak_source,
      "warmup_s": warmup_seconds, "peak_memory_gib": memory / 2**30,
      "peak_memory_source": memory_source}


def profile_steps(run: run_lib.Run, state: TrainState,
                  batches: Sequence[dict[str, np.ndarray]], directory: str, top: int = 15
                  ) -> tuple[TrainState, list[dict]]:
  """Traces a train step on each of `batches` (shapes already compiled) with jax.profiler into
  `directory` (a Perfetto trace beside TensorBoard's), and returns the `top` operations
  by total time: the device's kernels on an accelerator, the host's events on a CPU.
  Returns the state after them (the one passed in is donated) and those operations."""
  with run.activate(), jax.profiler.trace(directory, create_perfetto_trace=True):
    for batch in batches:
      state, out = run.train_step(state, partitioning.shard_batch(batch, run.mesh),
                                  run.dropout_key)
    jax.block_until_ready(out)
  path = sorted(glob.glob(os.path.join(directory, "**", "perfetto_trace.json.gz"),
                          recursive=True))[-1]
  with gzip.open(path) as f:
    events = json.load(f)
  events = events["traceEvents"] if isinstance(events, dict) else events
  processes = {e["pid"]: e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "process_name"}
  devices = {pid for pid, name in processes.items() if name.startswith("/device:")}
  totals = collections.Counter()
  for e in events:
    if e.get("ph") == "X" and (e["pid"] in devices if devices else
                               not e["name"].startswith("$")):
      totals[e["name"]] += e.get("dur", 0) / 1e3  # ms
  everything = sum(totals.values()) or 1.0
  ops = [{"name": name, "ms": ms / len(batches), "fraction": ms / everything}
         for name, ms in totals.most_common(top)]
  print(f"profile: {path}; top operations by time per step:")
  for op in ops[:8]:
    print(f"  {op['ms']:9.2f} ms  {100 * op['fraction']:5.1f}%  {op['name'][:90]}")
  return state, ops


def define_flags() -> None:
  """The command's flags (defined when run as a command, not on import)."""
  config_flags.DEFINE_config_file("config", None, "Config file (as for main).",
                                  lock_config=True)
  flags.DEFINE_string("workdir", None, "A training run's workdir: benchmark decoding its "
                      "latest checkpoint on --split (instead of --config's training).")
  flags.DEFINE_enum("split", "test", ["eval", "test"], "With --workdir: which split.")
  flags.DEFINE_integer("steps", 20, "Timed train steps (after the warm-up); 0: decoding "
                       "only.")
  flags.DEFINE_integer("warmup_steps", 2, "Untimed steps after compiling each batch shape.")
  flags.DEFINE_integer("pairs", 100_000, "Sentence pairs resampled at newstest2014's "
                       "lengths, to draw the train batches from.")
  flags.DEFINE_integer("decode_sentences", 3003, "newstest2014 sources to translate; 0: skip.")
  flags.DEFINE_integer("repeats", 3, "Timed decoding passes after the first; the best counts.")
  flags.DEFINE_string("compare_rev", None, "Also decode with the code of this git revision "
                      "(same sentences and weights) and print the speed-up.")
  flags.DEFINE_string("flax_wmt_dir", None, "Also decode with the Flax WMT example's beam "
                      "search (models.py and decode.py in this folder, e.g. a flax checkout's "
                      "examples/wmt) at the config's dimensions, and print the ratio.")
  flags.DEFINE_bool("ctranslate2", False, "With --workdir: also export the checkpoint to "
                    "CTranslate2 (pip install -e '.[export]') and time its beam search.")
  flags.DEFINE_string("newstest_dir", None,
                      "Directory with newstest2014.en and newstest2014.de, for realistic "
                      "lengths; default: sacreBLEU's download of wmt14/full (3,003 lines).")
  flags.DEFINE_bool("aot", False, "Only compile the train step and report memory per device.")
  flags.DEFINE_string("topology", None, "Compile only, for this TPU slice as gcloud names it "
                      "(v4-8, v5litepod-16, v5p-64, v6e-8; needs libtpu: pip install "
                      "'jax[tpu]') or these GPUs (8xH100, 16xH200; needs JAX's CUDA plugin: "
                      "pip install -e '.[gpu-aot]'): memory per chip against its HBM (exit 2 "
                      "if it does not fit, naming what would), and on a TPU the compiler's "
                      "step-time estimate.")
  flags.DEFINE_integer("num_slices", 1, "With --topology: this many slices (multislice).")
  flags.DEFINE_float("peak_tflops", None, "Per-device peak for MFU (default: by device kind).")
  flags.DEFINE_bool("json", False, "Print one JSON object of the figures on stdout (the "
                    "readable report goes to stderr).")
  flags.DEFINE_string("profile_dir", None, "Write a jax.profiler trace of 3 train steps "
                      "here, and report the operations that took the most time.")
  flags.DEFINE_string("results", None, "Write the figures (JSON) to this file when the "
                      "benchmark starts and again after each phase, so a time limit or a "
                      "failing phase loses nothing measured.")
  flags.DEFINE_float("budget_s", None, "Start no compile after this many seconds (the "
                     "phases it skips are recorded as skipped).")
