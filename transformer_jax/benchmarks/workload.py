"""What the speed benchmark runs: batches drawn as training draws them from pairs whose
lengths are newstest2014's (the paper's test set), and random weights whose beam search
never ends early (each output runs to its length limit, the worst case)."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import jax
import numpy as np
import sacrebleu.utils
from absl import flags
from ml_collections import config_flags

from transformer_jax.data import corpora, parallel_data, tokenizer
from transformer_jax.data.tokenizer import EOS_ID


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
                   pairs: int) -> parallel_data.ParallelData:
  """`pairs` pairs of random ids whose lengths are drawn (seeded, with replacement)
  from `lengths`, keeping those within max_length."""
  rng = np.random.default_rng(0)
  fits = np.array([(s, t) for s, t in lengths if max(s, t) <= max_length])
  drawn = fits[rng.integers(0, len(fits), pairs)]
  ids = lambda n: np.append(rng.integers(3, vocab_size, n - 1), 1).astype(np.int32)
  return parallel_data.ParallelData([ids(s) for s, _ in drawn], [ids(t) for _, t in drawn])


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


def define_flags() -> None:
  """The flags of the commands that time this project's train step on this workload
  (benchmark, benchmarks.peers): the config, the batches, and where the figures go."""
  config_flags.DEFINE_config_file("config", None, "Config file (as for main).",
                                  lock_config=True)
  flags.DEFINE_string("newstest_dir", None,
                      "Directory with newstest2014.en and newstest2014.de, for realistic "
                      "lengths; default: sacreBLEU's download of wmt14/full (3,003 lines).")
  flags.DEFINE_integer("pairs", 100_000, "Sentence pairs resampled at newstest2014's "
                       "lengths, to draw the train batches from.")
  flags.DEFINE_integer("warmup_steps", 2, "Untimed steps after compiling each batch shape.")
  flags.DEFINE_float("peak_tflops", None, "Per-device peak for MFU (default: by device kind).")
  flags.DEFINE_bool("json", False, "Print one JSON object of the figures on stdout (the "
                    "readable report goes to stderr).")
  flags.DEFINE_string("results", None, "Write the figures (JSON) to this file when the "
                      "benchmark starts and again after each phase, so a time limit or a "
                      "failing phase loses nothing measured.")
  flags.DEFINE_float("budget_s", None, "Start no phase that compiles after this many "
                     "seconds (those it skips are recorded as skipped).")
