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
(devices x peak); FLOPs per token = 6 x parameters + attention, the estimate in
docs/REFERENCE.md. On a CPU the peak is measured in the same run with a large matrix
product.

Decoding (beam search with the config's decode settings) is timed twice: with random
weights at newstest2014 lengths (outputs run to their length limit: the worst case),
and, with --workdir, for a trained run's latest checkpoint on a real split, with its
sacreBLEU. Each reports the first pass (which compiles one program per source width)
and the best of --repeats later passes. --compare_rev=REV decodes the same sentences
with the same weights using the code of an earlier git revision (extracted with `git
archive`, run in a subprocess) and prints the speed-up and how many outputs agree.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import flax.linen as nn
import flax.serialization
import numpy as np
import sacrebleu.utils
from absl import flags
from ml_collections import config_flags

from transformer_jax import bleu, cli, config as config_lib, corpora, inference
from transformer_jax import input_pipeline, optimizer, partitioning, tokenizer, train
from transformer_jax import model as model_lib
from transformer_jax.model import Transformer

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

# Dense bf16 peaks per device, TFLOP/s (docs/REFERENCE.md).
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "TPU v5p": 459.0,
               "TPU v6": 918.0, "TPU v5 lite": 197.0, "TPU v4": 275.0}


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
  if (FLAGS.config is None) == (FLAGS.workdir is None):
    cli.fail("give exactly one of --config (training and random-weight decoding) and "
             "--workdir (decoding a trained run).")
  if FLAGS.workdir:
    return benchmark_trained_decoding()
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
  if FLAGS.steps:
    state = benchmark_training(model, cfg, mesh, shardings, state, data)
  if FLAGS.decode_sentences:
    # newstest2014 lengths, random ids and weights: outputs run to the length limit.
    sources = [data.inputs[i] for i in range(min(FLAGS.decode_sentences, len(data)))]
    benchmark_decoding(state.params, model, sources, cfg.decode,
                       f"{len(sources)} newstest2014-length sentences, random weights")


def benchmark_training(model, cfg, mesh, shardings, state, data):
  """Times FLAGS.steps train steps; returns the state after them (the first is donated)."""
  model_cfg, rules = cfg.model, cfg.train.logical_axis_rules
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
  flops = model_lib.train_flops_per_target_token(model_cfg, num_params, mean_length)
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
  return state


def benchmark_trained_decoding() -> None:
  """Decoding of a trained run's latest checkpoint on a real split, with its scores."""
  try:
    trained = inference.load_workdir(FLAGS.workdir)
    params, step = inference.restore_params(trained)
    sources, references = corpora.load_split(trained.cfg.data, FLAGS.split)
  except (FileNotFoundError, RuntimeError, ValueError) as e:
    cli.fail(str(e))
  print(f"devices: {jax.device_count()} x {jax.devices()[0].device_kind}; "
        f"{FLAGS.workdir} step {step}")
  tok, lang = trained.tokenizer, trained.cfg.data.target_lang
  score = lambda outputs: bleu.score_translations(
      [tok.decode(ids) for ids in outputs], references, lang)["bleu"]
  encoded = tok.encode(sources)
  outputs, best = benchmark_decoding(
      params, trained.model, encoded, trained.cfg.decode,
      f"{len(sources)} {trained.cfg.data.task} {FLAGS.split} sentences", score)
  if FLAGS.ctranslate2:
    ct2_outputs, ct2_first, ct2_best = decode_with_ctranslate2(
        params, trained, encoded)
    _report("CTranslate2", encoded, ct2_outputs, ct2_first, ct2_best, None, score)
    same = sum(a == b for a, b in zip(outputs, ct2_outputs))
    print(f"  this code runs at {ct2_best / best:.2f}x CTranslate2's speed; {same} of "
          f"{len(sources)} outputs identical (its length penalty is length^alpha)")


def decode_with_ctranslate2(params, trained, encoded):
  """(outputs, first pass, best pass) of CTranslate2's beam search on the exported
  weights, on every core of this machine, with the run's decode settings."""
  import ctranslate2
  from transformer_jax import serving
  decode_cfg = trained.cfg.decode
  pieces = trained.tokenizer.pieces()
  ids = {piece: i for i, piece in enumerate(pieces)}
  sources = [[pieces[i] for i in row[:-1]] for row in encoded]  # It appends EOS.
  with tempfile.TemporaryDirectory() as tmp:
    serving.save_ctranslate2(params, trained.cfg.model, pieces, tmp)
    translator = ctranslate2.Translator(tmp, device="cpu", intra_threads=os.cpu_count())
    translate = lambda: translator.translate_batch(
        sources, max_batch_size=decode_cfg.batch_size, beam_size=decode_cfg.beam_size,
        length_penalty=decode_cfg.length_penalty, min_decoding_length=0,
        max_decoding_length=max(map(len, encoded)) + decode_cfg.max_extra_length)
    results, first, best = time_decoding(translate, FLAGS.repeats)
  return [[ids[p] for p in r.hypotheses[0]] for r in results], first, best


def benchmark_decoding(params, model, sources, decode_cfg, what: str, score=None):
  """Prints beam-search speed on `sources` (token ids) and, with --compare_rev, that of
  the revision's code on the same sentences and weights; `score(outputs)` -> BLEU.
  Returns (outputs, best seconds)."""
  outputs, first, best = time_decoding(
      lambda: inference.translate_ids(params, model, sources, decode_cfg), FLAGS.repeats)
  shapes = len(inference.decode_input_shapes(sources, model.config.max_len, decode_cfg,
                                             inference.params_mesh(params)))
  print(f"decode: {what}, beam {decode_cfg.beam_size}")
  _report("this code", sources, outputs, first, best, shapes, score)
  if FLAGS.compare_rev:
    old_outputs, old_first, old_best = decode_at_revision(
        FLAGS.compare_rev, params, model.config, decode_cfg, sources)
    _report(f"revision {FLAGS.compare_rev}", sources, old_outputs, old_first, old_best,
            None, score)
    same = sum(a == b for a, b in zip(outputs, old_outputs))
    print(f"  speed-up {old_best / best:.2f}x over revision {FLAGS.compare_rev}; "
          f"{same} of {len(sources)} outputs identical")
  return outputs, best


def _report(name, sources, outputs, first, best, shapes, score) -> None:
  tokens = sum(len(ids) + 1 for ids in outputs)  # + EOS
  compiled = f", compiling {shapes} programs" if shapes else ""
  bleu_text = f"; sacreBLEU {score(outputs):.2f}" if score else ""
  print(f"  {name}: first pass {first:.1f} s{compiled}; then {best:.2f} s: "
        f"{len(sources) / best:.1f} sentences/s, {tokens / best:,.0f} target tokens/s"
        f"{bleu_text}")


def time_decoding(translate, repeats: int):
  """(outputs, seconds of the first pass, best seconds of `repeats` more)."""
  start = time.perf_counter()
  outputs = translate()
  first = time.perf_counter() - start
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    translate()
    best = min(best, time.perf_counter() - start)
  return outputs, first, best


# Runs in an extracted older revision (its transformer_jax is the one imported), so it
# uses only what every revision has: ModelConfig, DecodeConfig, Transformer and
# inference.translate_ids(params, model, sources, decode_cfg).
_REVISION_WORKER = """
import dataclasses, json, sys, time
import flax.serialization
from transformer_jax import config as config_lib, inference
from transformer_jax import model as model_lib
from transformer_jax.model import Transformer

job = json.load(open(sys.argv[1]))
known = lambda cls, d: cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)
                              if f.name in d})
model = Transformer(known(config_lib.ModelConfig, job["model"]))
decode_cfg = known(config_lib.DecodeConfig, job["decode"])
params = flax.serialization.msgpack_restore(open(sys.argv[2], "rb").read())
translate = lambda: inference.translate_ids(params, model, job["sources"], decode_cfg)
start = time.perf_counter()
outputs = translate()
first = time.perf_counter() - start
best = float("inf")
for _ in range(job["repeats"]):
  start = time.perf_counter()
  translate()
  best = min(best, time.perf_counter() - start)
json.dump({"outputs": [list(map(int, o)) for o in outputs], "first": first, "best": best},
          open(sys.argv[3], "w"))
"""


def decode_at_revision(rev: str, params, model_cfg, decode_cfg, sources):
  """(outputs, first pass, best pass) of decoding `sources` with the code of git
  revision `rev` and the same weights, in a subprocess."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  with tempfile.TemporaryDirectory() as tmp:
    try:
      archive = subprocess.run(["git", "-C", root, "archive", rev], check=True,
                               capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
      cli.fail(f"--compare_rev={rev}: cannot extract it from the git repository at "
               f"{root}: {getattr(e, 'stderr', b'').decode().strip() or e}")
    subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
    job, weights, result = (os.path.join(tmp, n) for n in ("job.json", "params", "out.json"))
    with open(job, "w") as f:
      json.dump({"model": dataclasses.asdict(model_cfg),
                 "decode": dataclasses.asdict(decode_cfg),
                 "sources": [list(map(int, s)) for s in sources],
                 "repeats": FLAGS.repeats}, f)
    with open(weights, "wb") as f:
      f.write(flax.serialization.msgpack_serialize(
          jax.tree.map(np.asarray, nn.meta.unbox(params))))
    env = {**os.environ, "PYTHONPATH": tmp}
    subprocess.run([sys.executable, "-c", _REVISION_WORKER, job, weights, result],
                   cwd=tmp, env=env, check=True)
    with open(result) as f:
      out = json.load(f)
  return out["outputs"], out["first"], out["best"]


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
