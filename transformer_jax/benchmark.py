"""Measure training and decoding speed, MFU and memory; or compile ahead of time.

  python -m transformer_jax.benchmark --config=configs/transformer.py:base \
      --config.model.dtype=bfloat16 [--steps=20] [--decode_sentences=3003]
  python -m transformer_jax.benchmark --config=configs/transformer.py:big --aot \
      --config.train.mesh_shape="(1,8,1)"   # Memory per device, without running.

Batches have the sentence lengths of real text: newstest2014 EN-DE (the paper's test
set; sacreBLEU downloads it, or --newstest_dir names a local copy) is tokenized with a
SentencePiece model trained on it, and token ids are random (speed does not depend on
them). MFU = non-pad target tokens/s x FLOPs per target token /
(devices x peak); FLOPs per token = 6 x parameters + attention, the estimate in
docs/REFERENCE.md. On a CPU the peak is measured in the same run with a large matrix
product.
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

from transformer_jax import cli, config as config_lib, corpora, inference, input_pipeline
from transformer_jax import optimizer, partitioning, tokenizer, train
from transformer_jax.model import Transformer

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Config file (as for main).",
                                lock_config=True)
flags.DEFINE_integer("steps", 10, "Timed train steps (after one compile per shape).")
flags.DEFINE_integer("decode_sentences", 3003, "newstest2014 sources to translate; 0: skip.")
flags.DEFINE_string("newstest_dir", None,
                    "Directory with newstest2014.en and newstest2014.de, for realistic "
                    "lengths; default: sacreBLEU's download of wmt14/full (3,003 lines).")
flags.DEFINE_bool("aot", False, "Only compile the train step and report memory per device.")
flags.DEFINE_float("peak_tflops", None, "Per-device peak for MFU (default: by device kind).")
flags.mark_flags_as_required(["config"])

# Dense bf16 peaks per device, TFLOP/s (docs/REFERENCE.md).
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "TPU v5p": 459.0,
               "TPU v6": 918.0, "TPU v5 lite": 197.0, "TPU v4": 275.0}


def train_flops_per_target_token(cfg, num_params: int, mean_length: float) -> float:
  """6 N for the matrix products (forward and backward, N counting the shared embedding
  once, as the output projection) plus attention: 12 d n per self- or cross-attention
  block (scores and weighted sum, forward and backward), source and target tokens
  counted as equal."""
  blocks = cfg.num_encoder_layers + 2 * cfg.num_decoder_layers
  return 6.0 * num_params + 12.0 * cfg.d_model * mean_length * blocks


def device_peak_flops(dtype: str) -> tuple[float, str]:
  """(per-device peak FLOP/s, where the number came from)."""
  if FLAGS.peak_tflops:
    return FLAGS.peak_tflops * 1e12, "--peak_tflops"
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


def realistic_data(vocab_size: int, max_length: int) -> input_pipeline.ParallelData:
  """Random ids with newstest2014's tokenized lengths (English -> German)."""
  en, de = newstest2014(FLAGS.newstest_dir)
  with tempfile.TemporaryDirectory() as tmp:
    tok = tokenizer.load_or_train(os.path.join(tmp, "spm.model"), en + de,
                                  min(vocab_size, 8000), "bpe")
    lengths = [(len(s), len(t)) for s, t in zip(tok.encode(en), tok.encode(de))]
  rng = np.random.default_rng(0)
  fits = [(s, t) for s, t in lengths if max(s, t) <= max_length]
  ids = lambda n: np.append(rng.integers(3, vocab_size, n - 1), 1).astype(np.int32)
  return input_pipeline.ParallelData([ids(s) for s, _ in fits], [ids(t) for _, t in fits])


def main():
  try:
    cfg = config_lib.parse(FLAGS.config)
    data = None if FLAGS.aot else realistic_data(cfg.data.vocab_size, cfg.data.max_length)
  except (FileNotFoundError, ValueError) as e:
    cli.fail(str(e))
  cfg = config_lib.with_vocab(cfg, cfg.data.vocab_size)  # No tokenizer: ids are random.
  model_cfg = cfg.model
  model = Transformer(model_cfg)
  mesh = partitioning.make_mesh(cfg.train.mesh_shape)
  rules = cfg.train.logical_axis_rules
  tx, _ = optimizer.make_optimizer(cfg.optimizer, model_cfg.d_model)
  print(f"devices: {jax.device_count()} x {jax.devices()[0].device_kind}; "
        f"mesh {dict(mesh.shape)}; dtype {model_cfg.dtype}")
  if FLAGS.aot:
    return ahead_of_time(model, tx, mesh, cfg, rules)

  state, shardings = train.create_train_state(model, tx, mesh, jax.random.key(0), rules)
  num_params = sum(x.size for x in jax.tree.leaves(state.params))
  train_fn, _ = train.jit_steps(model, cfg, mesh, shardings)
  shards = partitioning.data_shards(mesh) * cfg.train.grad_accum_steps
  batches = [input_pipeline.train_batch(data, k, cfg.train, cfg.data.max_length, shards)
             for k in range(FLAGS.steps)]
  key = jax.random.key(1)
  with partitioning.activate(mesh, rules):
    compile_start = time.perf_counter()
    for shape in sorted({b["inputs"].shape for b in batches}):  # Compile every shape.
      first = next(b for b in batches if b["inputs"].shape == shape)
      state, out = train_fn(state, partitioning.global_batch(first, mesh), key)
    jax.block_until_ready(out)
    compile_seconds = time.perf_counter() - compile_start
    start = time.perf_counter()
    for batch in batches:
      state, out = train_fn(state, partitioning.global_batch(batch, mesh), key)
    jax.block_until_ready(out)
    seconds = time.perf_counter() - start
  tokens = sum(int((b["targets"] != 0).sum()) for b in batches)
  mean_length = float(np.mean(data.targets.lengths))
  flops = train_flops_per_target_token(model_cfg, num_params, mean_length)
  peak, peak_source = device_peak_flops(model_cfg.dtype)
  memory, memory_source = peak_memory_bytes()
  print(f"model: {num_params / 1e6:.1f}M parameters, "
        f"{flops / 1e6:.0f} MFLOP per target token (mean target length {mean_length:.1f})")
  print(f"train: {FLAGS.steps} steps of ~{cfg.train.batch_tokens} tokens per side in "
        f"{seconds:.2f} s (compile and first steps {compile_seconds:.1f} s)")
  print(f"  step time {seconds / FLAGS.steps * 1e3:.1f} ms; {tokens / seconds:,.0f} non-pad "
        f"target tokens/s; {memory / 2**30:.2f} GiB {memory_source}")
  print(f"  MFU {100 * tokens / seconds * flops / (peak * jax.device_count()):.1f}% of "
        f"{peak / 1e12:.2f} TFLOP/s per device, {peak_source}")

  if FLAGS.decode_sentences:
    # newstest2014 lengths, random ids.
    sources = [data.inputs[i] for i in range(min(FLAGS.decode_sentences, len(data)))]
    inference.translate_ids(state.params, model, sources[:cfg.decode.batch_size],
                             cfg.decode)  # Compile.
    start = time.perf_counter()
    outputs = inference.translate_ids(state.params, model, sources, cfg.decode)
    seconds = time.perf_counter() - start
    generated = sum(len(ids) + 1 for ids in outputs)  # + EOS
    print(f"decode: beam {cfg.decode.beam_size}, {len(sources)} newstest2014-length "
          f"sentences in {seconds:.1f} s: {len(sources) / seconds:.2f} sentences/s, "
          f"{generated / seconds:,.0f} generated tokens/s (untrained weights: outputs often "
          "run to the length limit, a slow case)")


def ahead_of_time(model, tx, mesh, cfg, rules) -> None:
  """Compiles the train step for the mesh without running it; memory per device."""
  abstract_state = train.abstract_train_state(model, tx, mesh, rules)
  shardings = jax.tree.map(lambda s: s.sharding, abstract_state)
  shards = partitioning.data_shards(mesh) * cfg.train.grad_accum_steps
  length = cfg.data.max_length
  rows = max(cfg.train.batch_tokens // length // shards, 1) * shards
  batch = {k: jax.ShapeDtypeStruct((rows, length), jnp.int32,
                                   sharding=partitioning.batch_sharding(mesh))
           for k in ("inputs", "targets")}
  train_fn, _ = train.jit_steps(model, cfg, mesh, shardings)
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype,
                             sharding=partitioning.replicated(mesh))
  start = time.perf_counter()
  with partitioning.activate(mesh, rules):
    compiled = train_fn.lower(abstract_state, batch, key).compile()
  memory = compiled.memory_analysis()
  gib = lambda b: b / 2**30
  total = (memory.argument_size_in_bytes + memory.output_size_in_bytes -
           memory.alias_size_in_bytes + memory.temp_size_in_bytes)
  print(f"compiled in {time.perf_counter() - start:.1f} s for a batch of {rows} x {length} "
        "(the longest bucket)")
  print(f"memory per device: arguments {gib(memory.argument_size_in_bytes):.2f} GiB, "
        f"outputs {gib(memory.output_size_in_bytes):.2f} GiB (donated "
        f"{gib(memory.alias_size_in_bytes):.2f}), temporaries "
        f"{gib(memory.temp_size_in_bytes):.2f} GiB; total {gib(total):.2f} GiB")


if __name__ == "__main__":
  cli.run(main)
