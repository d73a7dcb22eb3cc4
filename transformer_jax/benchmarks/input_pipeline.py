"""The input pipeline alone, at WMT14 EN-DE size: first start, restart, memory, speed.

  python -m transformer_jax.benchmarks.input_pipeline [--pairs=4500000] [--dir=/tmp/tjax_data_bench]

Generates a synthetic parallel corpus of --pairs pairs as two text files (once; kept in
--dir): Zipf-distributed words from a 60,000-word made-up vocabulary, English sentence
lengths log-normal around 20 words (about WMT14's 23-word mean, with its long tail,
clipped to 1-150 words), German lengths within about 15% of the English. Then, each in
a fresh process:

  first start  train the tokenizer (--tokenizer_sentences sampled sentences), tokenize
               the corpus into the memory-mapped cache, plan the first epoch
  restart      the cache is there: map it, plan the epoch, then build batches for
               --seconds: batches/s and non-padding target tokens/s of the pipeline

It reports the mean real (non-padding) source and target tokens a batch over an epoch,
and the wall time and peak resident memory of each phase. A second invocation with the
same --dir skips the generation (and the first start, with --restart_only).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

import numpy as np
from absl import flags

from transformer_jax import cli

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import)."""
  flags.DEFINE_integer("pairs", 4_500_000, "Sentence pairs of the synthetic corpus.")
  flags.DEFINE_string("dir", "/tmp/transformer_jax_data_benchmark",
                      "Where the corpus, the workdir and the cache go (kept).")
  flags.DEFINE_integer("tokenizer_sentences", 1_000_000, "Sentences sampled for the "
                       "tokenizer.")
  flags.DEFINE_integer("vocab_size", 37_000, "Tokenizer vocabulary (the paper's EN-DE).")
  flags.DEFINE_integer("batch_tokens", 25_000, "train.batch_tokens (the paper's).")
  flags.DEFINE_enum("batch_tokens_count", "real", ["real", "padded"],
                    "train.batch_tokens_count: what batch_tokens counts.")
  flags.DEFINE_float("seconds", 20.0, "How long the restart builds batches.")
  flags.DEFINE_bool("restart_only", False, "Skip the first start (its cache must exist).")
  flags.DEFINE_enum("phase", None, ["first", "restart"], "Internal: run one phase here.")

WORDS = 60_000


def _words(rng: np.random.Generator) -> np.ndarray:
  letters = np.array(list("abcdefghijklmnopqrstuvwxyzäöüß"))
  lengths = rng.integers(2, 12, WORDS)
  return np.array(["".join(rng.choice(letters, n)) for n in lengths], dtype=object)


def generate(directory: str, pairs: int, seed: int = 0, chunk: int = 100_000) -> None:
  """Writes train.en / train.de (and 3,000-pair eval files) of synthetic sentences."""
  rng = np.random.default_rng(seed)
  words = _words(rng)
  os.makedirs(directory, exist_ok=True)
  start = time.time()
  for split, count in (("eval", 3000), ("train", pairs)):
    with open(os.path.join(directory, f"{split}.en.partial"), "w") as en, \
        open(os.path.join(directory, f"{split}.de.partial"), "w") as de:
      for at in range(0, count, chunk):
        n = min(chunk, count - at)
        en_len = np.clip(rng.lognormal(np.log(20), 0.55, n), 1, 150).astype(int)
        de_len = np.clip(en_len * rng.lognormal(0, 0.15, n), 1, 150).astype(int)
        for f, lengths in ((en, en_len), (de, de_len)):
          ids = np.minimum(rng.zipf(1.3, lengths.sum()) - 1, WORDS - 1)
          sentences = np.split(words[ids], np.cumsum(lengths)[:-1])
          f.write("\n".join(" ".join(s) for s in sentences) + "\n")
        if split == "train" and (at // chunk) % 10 == 0:
          print(f"  generated {at + n:,} pairs ({time.time() - start:.0f} s)", flush=True)
    for side in ("en", "de"):
      os.replace(os.path.join(directory, f"{split}.{side}.partial"),
                 os.path.join(directory, f"{split}.{side}"))


def _config(directory: str):
  from transformer_jax.config import DataConfig, TrainConfig
  files = lambda split: f"{directory}/{split}.en,{directory}/{split}.de"
  data = DataConfig(task="text", train_files=files("train"), eval_files=files("eval"),
                    vocab_size=FLAGS.vocab_size, tokenizer_sentences=FLAGS.tokenizer_sentences,
                    max_length=256)
  return data, TrainConfig(batch_tokens=FLAGS.batch_tokens,
                           batch_tokens_count=FLAGS.batch_tokens_count)


def run_phase(phase: str) -> dict:
  """One phase, in this process; returns its measurements."""
  from transformer_jax.data import batching, corpora, tasks
  data_cfg, train_cfg = _config(FLAGS.dir)
  workdir = os.path.join(FLAGS.dir, "run")
  start = time.time()
  tasks.run_tokenizer(corpora.corpus(data_cfg), workdir)  # Trains it on the first start only.
  tokenizer_s = time.time() - start
  task = tasks.load_task(data_cfg, workdir)
  batching.train_batch(task.train, 0, train_cfg, data_cfg.max_length)
  ready = time.time() - start
  out = {"phase": phase, "seconds_to_first_batch": ready, "tokenizer_s": tokenizer_s,
         "pairs": len(task.train),
         "target_tokens": int(task.train.targets.lengths.sum()),
         "train_programs": len(batching.train_batch_shapes(
             task.train, train_cfg, data_cfg.max_length))}
  if phase == "restart":
    out["padding_fraction"] = batching.padding_fraction(task.train, train_cfg)
    out["real_tokens_per_batch"] = batching.real_tokens_per_batch(task.train, train_cfg,
                                                                  data_cfg.max_length)
    step, tokens, t0 = 1, 0, time.time()
    while time.time() - t0 < FLAGS.seconds:
      batch = batching.train_batch(task.train, step, train_cfg, data_cfg.max_length)
      tokens += int((batch["targets"] != 0).sum())
      step += 1
    elapsed = time.time() - t0
    out.update(batches_per_s=(step - 1) / elapsed, target_tokens_per_s=tokens / elapsed)
  out["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
  out["anon_rss_gib"] = _status_kib("RssAnon") / 2**20
  return out


def _status_kib(field: str) -> int:
  """A /proc/self/status memory field (Linux): RssAnon is the process's own memory,
  without the pages of memory-mapped files (shared, and dropped under pressure)."""
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1])
  return 0


def _child(phase: str) -> dict:
  args = [sys.executable, "-m", "transformer_jax.benchmarks.input_pipeline", f"--phase={phase}",
          *[a for a in sys.argv[1:] if not a.startswith("--phase")]]
  start = time.time()
  proc = subprocess.run(args, capture_output=True, text=True)
  if proc.returncode:
    sys.stderr.write(proc.stderr[-5000:])
    cli.fail(f"the {phase} phase failed (exit {proc.returncode})", 1)
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  result["wall_s"] = time.time() - start  # With the imports of a fresh process.
  return result


def main():
  if FLAGS.phase:
    print(json.dumps(run_phase(FLAGS.phase)))
    return
  corpus = os.path.join(FLAGS.dir, "train.de")
  if not os.path.exists(corpus):
    print(f"generating {FLAGS.pairs:,} synthetic pairs in {FLAGS.dir} ...", flush=True)
    t0 = time.time()
    generate(FLAGS.dir, FLAGS.pairs)
    print(f"  done in {time.time() - t0:.0f} s")
  results = [] if FLAGS.restart_only else [_child("first")]
  results.append(_child("restart"))
  size = sum(os.path.getsize(os.path.join(FLAGS.dir, f"train.{s}")) for s in ("en", "de"))
  print(f"corpus: {results[-1]['pairs']:,} pairs ({size / 2**30:.2f} GiB of text), "
        f"{results[-1]['target_tokens']:,} target tokens, vocabulary {FLAGS.vocab_size}, "
        f"{results[-1]['train_programs']} train-step shapes "
        f"({100 * results[-1]['padding_fraction']:.1f}% padding)")
  source, target = results[-1]["real_tokens_per_batch"]
  print(f"batches (train.batch_tokens={FLAGS.batch_tokens}, counted as "
        f"{FLAGS.batch_tokens_count!r}): {source:,.0f} real source and {target:,.0f} real "
        f"target tokens a batch, the mean over an epoch")
  for r in results:
    line = (f"{r['phase']:>8}: {r['wall_s']:.1f} s wall ({r['seconds_to_first_batch']:.1f} s "
            f"to the first batch after imports, {r['tokenizer_s']:.1f} s of them for the "
            f"tokenizer), peak RSS {r['peak_rss_gib']:.2f} GiB "
            f"({r['anon_rss_gib']:.2f} GiB of it not file-backed at the end)")
    if r["phase"] == "restart":
      line += (f"; pipeline alone {r['batches_per_s']:.1f} batches/s, "
               f"{r['target_tokens_per_s'] / 1e6:.2f}M target tokens/s")
    print(line)


if __name__ == "__main__":
  define_flags()
  cli.run(main)
