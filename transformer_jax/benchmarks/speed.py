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
token = 6 x parameters + attention (transformer.train_flops_per_target_token). Peaks per
device kind come from the vendors' datasheets (dense bfloat16; PEAK_TFLOPS in
planning/topology.py); an unlisted accelerator reports "unknown peak" (give
--peak_tflops); on a CPU the peak is measured in the same run with a large matrix
product. --profile_dir writes a
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

import itertools
import os
import sys
import time

import jax
from absl import flags

from transformer_jax import cli, config as config_lib, partitioning
from transformer_jax.benchmarks import decoding, step_profile, timing, workload
from transformer_jax.benchmarks.phases import now, Phases, provenance, report
from transformer_jax.model import attention
from transformer_jax.planning import fit, roofline, topology
from transformer_jax.training import compilation, run as run_lib

FLAGS = flags.FLAGS

def main():
  if (FLAGS.config is None) == (FLAGS.workdir is None):
    cli.fail("give exactly one of --config (training and random-weight decoding) and "
             "--workdir (decoding a trained run).")
  if FLAGS.workdir:
    report(lambda: decoding.benchmark_trained_decoding(
        FLAGS.workdir, FLAGS.split, FLAGS.repeats, FLAGS.compare_rev, FLAGS.ctranslate2),
           FLAGS.json)
  else:
    report(lambda: benchmark_config(FLAGS.config), FLAGS.json)


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
    lengths = None if aot_only else workload.newstest_lengths(cfg.data.vocab_size,
                                                              FLAGS.newstest_dir)
  except (FileNotFoundError, ValueError, RuntimeError) as e:
    cli.fail(str(e).strip().splitlines()[-1] if isinstance(e, RuntimeError) else str(e))
  cfg = config_lib.with_vocab(cfg, cfg.data.vocab_size)  # No tokenizer: ids are random.
  figures = _what_runs(cfg, mesh)
  if aot_only:
    return {**figures, **fit.report(cfg, mesh, target, FLAGS.num_slices)}
  figures.update(provenance=provenance(), started=now())
  phases = Phases(figures, FLAGS.results, FLAGS.budget_s)
  made = phases.run("init", lambda: run_lib.make_run(cfg, mesh))
  if made is not None:
    _Measured(cfg, *made, lengths, phases).measure()
  return phases.end()


def _what_runs(cfg: config_lib.Config, mesh) -> dict:
  """The devices, the mesh and every option that changes speed: printed, and the start
  of the figures."""
  device = mesh.devices.flat[0]
  figures = {"device_kind": device.device_kind, "devices": mesh.devices.size,
             "jax_version": jax.__version__,
             "config": " ".join(a for a in sys.argv[1:] if a.startswith("--config")),
             "dtype": cfg.model.dtype,
             "attention": attention.attention_implementation(cfg.model),
             "rng_impl": cfg.train.rng_impl, "loss_kernel": cfg.train.loss_kernel,
             "norm_kernel": cfg.model.norm_kernel, "ffn_kernel": cfg.model.ffn_kernel,
             "dot_merger": cfg.train.dot_merger, "scan_layers": cfg.model.scan_layers,
             "mesh": dict(mesh.shape)}
  print(f"devices: {mesh.devices.size} x {device.device_kind}; "
        f"mesh {dict(mesh.shape)}; dtype {cfg.model.dtype}; attention "
        f"{figures['attention']}; dropout bits {cfg.train.rng_impl}; loss "
        f"{cfg.train.loss_kernel}; residual norm {cfg.model.norm_kernel}; feed-forward "
        f"{cfg.model.ffn_kernel}; dot merger {'on' if cfg.train.dot_merger else 'off'}")
  return figures


class _Measured:
  """The compile, train, decode and profile phases of one run, on its batches."""

  def __init__(self, cfg, run, state, lengths, phases: Phases):
    self.cfg, self.run, self.phases, self.figures = cfg, run, phases, phases.figures
    self.live = {"state": state}  # Each train step donates the state it is given.
    self.profiled = 3 if FLAGS.profile_dir else 0  # Train steps traced.
    num_batches = max(FLAGS.warmup_steps + FLAGS.steps if FLAGS.steps else 0, self.profiled)
    self.data = (workload.realistic_data(cfg.data.vocab_size, cfg.data.max_length, lengths,
                                         FLAGS.pairs) if num_batches else None)
    self.batches = [run.train_batch(self.data, k) for k in range(num_batches)]
    if FLAGS.profile_dir:  # The profile's step: the widest batch, as --topology predicts.
      widest = max(run.train_batch_shapes(self.data), key=lambda s: s["targets"][1])["targets"]
      stream = (run.train_batch(self.data, k) for k in itertools.count())  # Each built once.
      self.live["profiled"] = next(b for b in stream if b["targets"].shape == widest)
      self.batches.append(self.live["profiled"])
    self.sources = []
    if FLAGS.decode_sentences:  # newstest2014 lengths, random ids: run to the length limit.
      news = workload.realistic_data(cfg.data.vocab_size, cfg.model.max_len, lengths,
                                     len(lengths))
      self.sources = [news.inputs[i] for i in range(min(FLAGS.decode_sentences, len(news)))]
    self.shapes = timing.batch_shapes(self.batches)

  def measure(self) -> None:
    self.phases.run("compile", self.compile_all, needs=["init"])
    with compilation.count_compiles() as later:
      if FLAGS.steps:
        self.phases.run("train", self.train, needs=["compile"], measures=True)
      if self.sources:
        self.phases.run("decode", self.decode, needs=["compile"], measures=True)
      if FLAGS.profile_dir:
        self.phases.run("profile", self.profile,
                        needs=["compile"] + (["train"] if FLAGS.steps else []), measures=True)
    self.figures["recompiled"] = compilation.recompiled(self.live.get("ahead", []), later)
    if self.figures["recompiled"]:
      print(f"compiled again after the ahead-of-time pass: {self.figures['recompiled']}")

  def compile_all(self) -> None:
    live, run = self.live, self.run
    if self.sources:  # Its own copy: training donates the state's.
      live["decode_params"] = workload.without_eos(live["state"].params)
    programs = [*compilation.train_programs(run, live["state"], self.shapes),
                *(compilation.decode_programs(run, live["decode_params"], self.sources,
                                              self.cfg.decode) if self.sources else [])]
    start = time.perf_counter()
    with compilation.count_compiles() as compiled:
      executables = compilation.compile_ahead(programs)
    live["ahead"] = compiled
    live["train_programs"] = dict(zip((s["inputs"] for s in self.shapes), executables))
    self.figures.update(compile_s=time.perf_counter() - start, programs=len(programs),
                        compiled_programs=sorted(c.name for c in compiled))
    print(f"compiled {len(programs)} programs ({len(self.shapes)} train step shapes, "
          f"{len(programs) - len(self.shapes)} beam search) in "
          f"{self.figures['compile_s']:.1f} s")

  def train(self) -> None:
    self.live["state"], timed = timing.benchmark_training(
        self.run, self.live["state"], self.batches, self.data, FLAGS.steps,
        FLAGS.warmup_steps, FLAGS.peak_tflops)
    self.figures.update(timed)

  def decode(self) -> None:
    with self.run.activate():
      outputs, seconds = decoding.benchmark_decoding(
          self.live["decode_params"], self.run.model, self.sources, self.cfg.decode,
          f"{len(self.sources)} newstest2014-length sentences, random weights (EOS "
          "never chosen: each runs to its length limit)",
          FLAGS.repeats, FLAGS.compare_rev, flax_wmt_dir=FLAGS.flax_wmt_dir)
    self.figures.update(decode_sentences=len(self.sources), decode_s=seconds,
                        decode_target_tokens=sum(len(o) + 1 for o in outputs),
                        decode_beam_size=self.cfg.decode.beam_size,
                        decode_peak_memory_gib=timing.peak_memory_bytes()[0] / 2**30)

  def profile(self) -> None:
    largest = self.live["profiled"]
    self.live["state"], self.figures["top_ops"], events = step_profile.profile_steps(
        self.run, self.live["state"], [largest] * self.profiled, FLAGS.profile_dir)
    program = self.live["train_programs"][largest["inputs"].shape].as_text()
    with open(os.path.join(FLAGS.profile_dir, "train_step.hlo.txt"), "w") as f:
      f.write(program)  # What the trace's kernels are named after.
    split = step_profile.breakdown(events, roofline.kernels(program), self.profiled,
                                   *timing.measured_rates(self.cfg.model.dtype),
                                   containers=roofline.containers(program))
    if split:
      self.figures["breakdown"] = {"batch": list(largest["targets"].shape), **split}
      print("\n".join(step_profile.describe(split)))
    else:
      print("profile: no kernel of the train step in the trace (no breakdown)")


def define_flags() -> None:
  """The command's flags (defined when run as a command, not on import)."""
  workload.define_flags()
  flags.DEFINE_string("workdir", None, "A training run's workdir: benchmark decoding its "
                      "latest checkpoint on --split (instead of --config's training).")
  flags.DEFINE_enum("split", "test", ["eval", "test"], "With --workdir: which split.")
  flags.DEFINE_integer("steps", 20, "Timed train steps (after the warm-up); 0: decoding "
                       "only.")
  flags.DEFINE_integer("decode_sentences", 3003, "newstest2014 sources to translate; 0: skip.")
  flags.DEFINE_integer("repeats", 3, "Timed decoding passes after the first; the best counts.")
  flags.DEFINE_string("compare_rev", None, "Also decode with the code of this git revision "
                      "(same sentences and weights) and print the speed-up.")
  flags.DEFINE_string("flax_wmt_dir", None, "Also decode with the Flax WMT example's beam "
                      "search (models.py and decode.py in this folder, e.g. a flax checkout's "
                      "examples/wmt) at the config's dimensions, and print the ratio.")
  flags.DEFINE_bool("ctranslate2", False, "With --workdir: also export the checkpoint to "
                    "CTranslate2 (pip install -e '.[export]') and time its beam search.")
  flags.DEFINE_bool("aot", False, "Only compile the train step and report memory per device.")
  flags.DEFINE_string("topology", None, "Compile only, for this TPU slice as gcloud names it "
                      "(v4-8, v5litepod-16, v5p-64, v6e-8; needs libtpu: pip install "
                      "'jax[tpu]') or these GPUs (8xH100, 16xH200; needs JAX's CUDA plugin: "
                      "pip install -e '.[gpu-aot]'): memory per chip against its HBM (exit 2 "
                      "if it does not fit, naming what would), and on a TPU the compiler's "
                      "step-time estimate.")
  flags.DEFINE_integer("num_slices", 1, "With --topology: this many slices (multislice).")
  flags.DEFINE_string("profile_dir", None, "Write a jax.profiler trace of 3 train steps "
                      "here, and report the operations that took the most time.")
