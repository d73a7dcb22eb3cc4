r"""Measure training and decoding speed, MFU and memory; or compile ahead of time.

  python -m transformer_jax.benchmark --config=configs/transformer.py:base \
      --config.model.dtype=bfloat16 [--steps=20] [--decode_sentences=3003]
  python -m transformer_jax.benchmark --config=configs/transformer.py:big --aot \
      --config.train.mesh_shape="(1,8,1)"   # Memory per device, without running.
  python -m transformer_jax.benchmark --workdir=runs/m30k [--split=test]  # Decoding only.

Batches have the sentence lengths of real text: newstest2014 EN-DE (the paper's test
set; sacreBLEU downloads it, or --newstest_dir names a local copy) is tokenized with a
SentencePiece model trained on it, and token ids are random (speed does not depend on
them). MFU = non-pad target tokens/s x FLOPs per target token /
(devices x peak); FLOPs per token = 6 x parameters + attention
(model.train_flops_per_target_token). On a CPU the peak is measured in the same run
with a large matrix product.

Decoding (beam search with the config's decode settings) is timed twice: with random
weights at newstest2014 lengths (outputs run to their length limit: the worst case),
and, with --workdir, for a trained run's latest checkpoint on a real split, with its
sacreBLEU. Each reports the first pass (which compiles one program per source width)
and the best of --repeats later passes. --compare_rev=REV decodes the same sentences
with the same weights using the code of an earlier git revision (extracted with `git
archive`, run in a subprocess) and prints the speed-up and how many outputs agree.
"""

from __future__ import annotations

import os
import resource
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import sacrebleu.utils
from absl import flags
from ml_collections import config_flags

from transformer_jax import batching, cli, config as config_lib, corpora, decode_benchmark
from transformer_jax import partitioning, tokenizer, train
from transformer_jax import model as model_lib

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Config file (as for main).",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "A training run's workdir: benchmark decoding its "
                    "latest checkpoint on --split (instead of --config's training).")
flags.DEFINE_enum("split", "test", ["eval", "test"], "With --workdir: which split.")
flags.DEFINE_integer("steps", 10, "Timed train steps (after one compile per shape); 0: "
                     "decoding only.")
flags.DEFINE_integer("decode_sentences", 3003, "newstest2014 sources to translate; 0: skip.")
flags.DEFINE_integer("repeats", 3, "Timed decoding passes after the first; the best counts.")
flags.DEFINE_string("compare_rev", None, "Also decode with the code of this git revision "
                    "(same sentences and weights) and print the speed-up.")
flags.DEFINE_bool("ctranslate2", False, "With --workdir: also export the checkpoint to "
                  "CTranslate2 (pip install -e '.[export]') and time its beam search.")
flags.DEFINE_string("newstest_dir", None,
                    "Directory with newstest2014.en and newstest2014.de, for realistic "
                    "lengths; default: sacreBLEU's download of wmt14/full (3,003 lines).")
flags.DEFINE_bool("aot", False, "Only compile the train step and report memory per device.")
flags.DEFINE_float("peak_tflops", None, "Per-device peak for MFU (default: by device kind).")

# Dense bf16 peaks per device, TFLOP/s (the vendors' datasheets).
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "TPU v5p": 459.0,
               "TPU v6": 918.0, "TPU v5 lite": 197.0, "TPU v4": 275.0}


def device_peak_flops(dtype: str, peak_tflops: float | None = None) -> tuple[float, str]:
  """(per-device peak FLOP/s, where the number came from)."""
  if peak_tflops:
    return peak_tflops * 1e12, "--peak_tflops"
  kind = jax.devices()[0].device_kind
  for name, tflops in PEAK_TFLOPS.items():
    if name.lower() in kind.lower():
      return tflops * 1e12, f"table ({name} dense bf16)"
  n = 4096  # CPU or unknown: measure a large matrix product now.
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


def realistic_data(vocab_size: int, max_length: int,
                   newstest_dir: str | None) -> batching.ParallelData:
  """Random ids with newstest2014's tokenized lengths (English -> German)."""
  en, de = newstest2014(newstest_dir)
  with tempfile.TemporaryDirectory() as tmp:
    tok = tokenizer.load_or_train(os.path.join(tmp, "spm.model"), en + de,
                                  min(vocab_size, 8000), "bpe")
    lengths = [(len(s), len(t)) for s, t in zip(tok.encode(en), tok.encode(de))]
  rng = np.random.default_rng(0)
  fits = [(s, t) for s, t in lengths if max(s, t) <= max_length]
  ids = lambda n: np.append(rng.integers(3, vocab_size, n - 1), 1).astype(np.int32)
  return batching.ParallelData([ids(s) for s, _ in fits], [ids(t) for _, t in fits])


def main():
  if (FLAGS.config is None) == (FLAGS.workdir is None):
    cli.fail("give exactly one of --config (training and random-weight decoding) and "
             "--workdir (decoding a trained run).")
  if FLAGS.workdir:
    return decode_benchmark.benchmark_trained_decoding(
        FLAGS.workdir, FLAGS.split, FLAGS.repeats, FLAGS.compare_rev, FLAGS.ctranslate2)
  try:
    cfg = config_lib.parse(FLAGS.config)
    mesh = partitioning.make_mesh(cfg.train.mesh_shape)
    data = None if FLAGS.aot else realistic_data(cfg.data.vocab_size, cfg.data.max_length,
                                                 FLAGS.newstest_dir)
  except (FileNotFoundError, ValueError) as e:
    cli.fail(str(e))
  cfg = config_lib.with_vocab(cfg, cfg.data.vocab_size)  # No tokenizer: ids are random.
  print(f"devices: {jax.device_count()} x {jax.devices()[0].device_kind}; "
        f"mesh {dict(mesh.shape)}; dtype {cfg.model.dtype}")
  if FLAGS.aot:
    return ahead_of_time(*train.make_run(cfg, mesh, abstract=True))
  run, state = train.make_run(cfg, mesh)
  if FLAGS.steps:
    state = benchmark_training(run, state, data, FLAGS.steps, FLAGS.peak_tflops)
  if FLAGS.decode_sentences:
    # newstest2014 lengths, random ids and weights: outputs run to the length limit.
    sources = [data.inputs[i] for i in range(min(FLAGS.decode_sentences, len(data)))]
    decode_benchmark.benchmark_decoding(
        state.params, run.model, sources, cfg.decode,
        f"{len(sources)} newstest2014-length sentences, random weights", FLAGS.repeats,
        FLAGS.compare_rev)


def benchmark_training(run: train.Run, state: train.TrainState,
                       data: batching.ParallelData, steps: int,
                       peak_tflops: float | None = None) -> train.TrainState:
  """Times `steps` train steps after compiling every batch shape they use; returns the
  state after them (the one passed in is donated)."""
  cfg = run.cfg
  num_params = sum(x.size for x in jax.tree.leaves(state.params))
  batches = [run.train_batch(data, k) for k in range(steps)]
  with run.activate():
    compile_start = time.perf_counter()
    for shape in sorted({b["inputs"].shape for b in batches}):  # Compile every shape.
      first = next(b for b in batches if b["inputs"].shape == shape)
      state, out = run.train_step(state, partitioning.shard_batch(first, run.mesh),
                                  run.dropout_key)
    jax.block_until_ready(out)
    compile_seconds = time.perf_counter() - compile_start
    start = time.perf_counter()
    for batch in batches:
      state, out = run.train_step(state, partitioning.shard_batch(batch, run.mesh),
                                  run.dropout_key)
    jax.block_until_ready(out)
    seconds = time.perf_counter() - start
  tokens = sum(int((b["targets"] != 0).sum()) for b in batches)
  mean_length = float(np.mean(data.targets.lengths))
  flops = model_lib.train_flops_per_target_token(cfg.model, num_params, mean_length)
  peak, peak_source = device_peak_flops(cfg.model.dtype, peak_tflops)
  memory, memory_source = peak_memory_bytes()
  print(f"model: {num_params / 1e6:.1f}M parameters, "
        f"{flops / 1e6:.0f} MFLOP per target token (mean target length {mean_length:.1f})")
  print(f"train: {steps} steps of ~{cfg.train.batch_tokens} tokens per side in "
        f"{seconds:.2f} s (compile and first steps {compile_seconds:.1f} s)")
  print(f"  step time {seconds / steps * 1e3:.1f} ms; {tokens / seconds:,.0f} non-pad "
        f"target tokens/s; {memory / 2**30:.2f} GiB {memory_source}")
  print(f"  MFU {100 * tokens / seconds * flops / (peak * jax.device_count()):.1f}% of "
        f"{peak / 1e12:.2f} TFLOP/s per device, {peak_source}")
  return state


def ahead_of_time(run: train.Run, abstract_state: train.TrainState) -> None:
  """Compiles the train step for the mesh without running it, for the largest batch
  `train.batching` makes (one pair of data.max_length tokens decides the shape), and
  prints the memory per device."""
  length = run.cfg.data.max_length
  longest = np.ones(length, np.int32)
  shapes = run.train_batch_shapes(batching.ParallelData([longest], [longest]))[-1]
  batch = {k: jax.ShapeDtypeStruct(shape, jnp.int32,
                                   sharding=partitioning.batch_sharding(run.mesh))
           for k, shape in shapes.items()}
  key = jax.ShapeDtypeStruct((), run.dropout_key.dtype,
                             sharding=partitioning.replicated(run.mesh))
  start = time.perf_counter()
  with run.activate():
    compiled = run.train_step.lower(abstract_state, batch, key).compile()
  memory = compiled.memory_analysis()
  gib = lambda b: b / 2**30
  total = (memory.argument_size_in_bytes + memory.output_size_in_bytes -
           memory.alias_size_in_bytes + memory.temp_size_in_bytes)
  rows, width = shapes["inputs"]
  print(f"compiled in {time.perf_counter() - start:.1f} s for a batch of {rows} x {width} "
        f"(the longest, train.batching={run.cfg.train.batching!r})")
  print(f"memory per device: arguments {gib(memory.argument_size_in_bytes):.2f} GiB, "
        f"outputs {gib(memory.output_size_in_bytes):.2f} GiB (donated "
        f"{gib(memory.alias_size_in_bytes):.2f}), temporaries "
        f"{gib(memory.temp_size_in_bytes):.2f} GiB; total {gib(total):.2f} GiB")


if __name__ == "__main__":
  cli.run(main)
