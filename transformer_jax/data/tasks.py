"""A run's task: its tokenizer (trained once, by process 0, and kept in the workdir),
the training split tokenized once into memory maps, and the held-out pairs."""

from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np
from etils import epath
from jax.experimental import multihost_utils

from transformer_jax import files
from transformer_jax.config import DataConfig, NotPrepared
from transformer_jax.data import corpora, tokenized, tokenizer as tokenizer_lib
from transformer_jax.data.parallel_data import encode_pairs, limit_length, ParallelData, Sequences
from transformer_jax.data.pretokenize import Pretokenizer


@dataclasses.dataclass(frozen=True)
class Task:
  """What a run trains and evaluates on."""

  tokenizer: tokenizer_lib.Subwords
  train: ParallelData
  eval: ParallelData  # Held-out pairs for the loss, tokenized.
  eval_sources: list[str]  # The same held-out pairs as text, for BLEU.
  eval_references: list[str]
  corpus: corpora.Corpus  # Where they came from, and its test split (corpus.split).


def load_task(cfg: DataConfig, workdir: str) -> Task:
  """The configured task, tokenized. The tokenizer is trained once per run, by process
  0, on the training split and kept in `workdir`; the training split is tokenized once
  per corpus and tokenizer and memory-mapped after that (tokenized.py). A run of one
  process prepares what is missing (TFDS's dataset, the tokenizer, the tokenized split);
  a run of several builds nothing: it reads what `main --prepare_data` prepared, or
  raises NotPrepared. Either way every process says which in one line, with where."""
  build = jax.process_count() == 1
  corpus = corpora.corpus(cfg)
  parts = [corpus.prepare(build)]
  tok, tokenizer_built = run_tokenizer(corpus, workdir, build)
  parts.append((tokenizer_built, f"the tokenizer {tok.model_file}"))
  identity = corpus.identity()
  name, shared = tokenized.fingerprint(identity, tok), cache_dir(cfg, workdir)
  if files.is_remote(shared):  # Memory maps need a local file: a copy on this host.
    directory = os.path.join(os.path.expanduser(LOCAL_CACHE), name)
    arrays, cache_built = tokenized.load_or_build(
        directory, corpus.train_chunks(), tok, {"corpus": identity},
        epath.Path(shared) / name, publish=jax.process_index() == 0, build=build)
  else:
    directory = os.path.join(shared, name)
    arrays, cache_built = tokenized.load_or_build(
        directory, corpus.train_chunks(), tok, {"corpus": identity}, build=build)
  parts.append((cache_built, f"the tokenized training split in {directory}"))
  say_prepared([part for part in parts if part is not None])
  if jax.process_count() > 1:  # Every process must train on the same ids.
    multihost_utils.assert_equal(
        np.frombuffer(bytes.fromhex(os.path.basename(directory)), np.uint8),
        "processes disagree on the tokenizer or the training corpus")
  train = ParallelData(*(Sequences.from_flat(*arrays[side]) for side in tokenized.SIDES))
  eval_src, eval_tgt = corpus.split("eval")
  return Task(tokenizer=tok,
              train=limit_length(train, cfg.max_length, f"{cfg.task}/train", cfg.overlong),
              eval=encode_pairs(tok, eval_src, eval_tgt, cfg.max_length,
                                f"{cfg.task}/eval, for the held-out loss (BLEU translates "
                                "whole sentences)", "truncate"),
              eval_sources=eval_src, eval_references=eval_tgt, corpus=corpus)


# Where a host keeps its copy of the tokenized split when data.cache_dir is a bucket, or
# its own when the workdir is remote and data.cache_dir is unset.
LOCAL_CACHE = "~/.cache/transformer_jax/tokenized"


def cache_dir(cfg: DataConfig, workdir: str) -> str:
  """data.cache_dir (a bucket's: copied to each host's LOCAL_CACHE), or WORKDIR/tokenized
  for a local workdir, or LOCAL_CACHE when the workdir is remote."""
  if cfg.cache_dir:
    return cfg.cache_dir if files.is_remote(cfg.cache_dir) else os.path.expanduser(cfg.cache_dir)
  if files.is_remote(workdir):
    return os.path.expanduser(LOCAL_CACHE)
  return os.path.join(workdir, "tokenized")


def sample_sentences(corpus: corpora.Corpus, seed: int = 0) -> list[str]:
  """data.tokenizer_sentences sentences (sources and targets) drawn uniformly from the
  training split by a seeded reservoir over the streamed chunks: the same corpus gives
  the same sample, in any process (SentencePiece's own sampling does not). Each is then
  prepared as data.pretokenize says for its side (the sample only, not the split)."""
  rng, size = np.random.default_rng(seed), corpus.cfg.tokenizer_sentences
  sample: list[tuple[bool, str]] = []  # (a target sentence, its text)
  seen = 0
  for chunk in corpus.train_chunks():
    for target, texts in enumerate(chunk):
      side = [(bool(target), text) for text in texts]
      fill = min(size - len(sample), len(side))
      sample += side[:fill]
      rest = side[fill:]
      if rest:  # Sentence number p replaces a random slot with probability size / (p + 1).
        slots = (rng.random(len(rest)) * (seen + fill + np.arange(1, len(rest) + 1)))
        for i in np.nonzero(slots < size)[0]:
          sample[int(slots[i])] = rest[i]
      seen += len(side)
  pretokenizer = Pretokenizer.of(corpus.cfg)
  return [(pretokenizer.target if target else pretokenizer.source)([text])[0]
          for target, text in sample]


def run_tokenizer(corpus: corpora.Corpus, workdir: str, build: bool = True
                  ) -> tuple[tokenizer_lib.Subwords, bool]:
  """(the run's tokenizer, whether it was trained now). Process 0 trains it, or copies
  data.tokenizer_file (if the workdir has none); the others wait and load that file, so
  every process has the same vocabulary. Without `build` none is trained: a workdir
  without one (and no data.tokenizer_file) is NotPrepared, in every process at once."""
  cfg, path = corpus.cfg, epath.Path(workdir) / "tokenizer.model"
  missing = not path.exists()
  if missing and not build and not cfg.tokenizer_file:
    raise NotPrepared(f"the tokenizer is not prepared: {path} does not exist")
  if jax.process_index() == 0 and missing:
    if cfg.tokenizer_file:
      shared = epath.Path(cfg.tokenizer_file)
      if not shared.exists():
        raise ValueError(f"data.tokenizer_file={cfg.tokenizer_file}: no such file (a "
                         "SentencePiece model, e.g. a run's WORKDIR/tokenizer.model).")
      files.write_atomic(path, shared.read_bytes())
    elif cfg.tokenizer_type == "marian":
      raise ValueError(f'data.tokenizer_type="marian": {path} is missing; a Marian '
                       "tokenizer is never trained here: import its model with "
                       "python -m transformer_jax.import_model.")
    elif cfg.tokenizer_type == "subword_nmt":
      sides = train_sentences(corpus)
      tokenizer_lib.learn_subword_nmt(path, *sides, cfg.vocab_size)
    else:
      tokenizer_lib.load_or_train(path, sample_sentences(corpus), cfg.vocab_size,
                                  cfg.tokenizer_type)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("tokenizer trained")
  return (tokenizer_lib.load(path, Pretokenizer.of(cfg)),
          missing and not cfg.tokenizer_file)


def say_prepared(parts: list[tuple[bool, str]]) -> None:
  """One line in every process's log: whether it built the data or read what was
  built, and where (printed: processes other than 0 log warnings only)."""
  built = [where for was_built, where in parts if was_built]
  read = [where for was_built, where in parts if not was_built]
  who = f"process {jax.process_index()} of {jax.process_count()}"
  if built:
    print(f"data: {who} built it here: {'; '.join(built)}"
          + f" (read as prepared before: {'; '.join(read)})" * bool(read), flush=True)
  else:
    print(f"data: {who} read what was prepared, building nothing: {'; '.join(read)}",
          flush=True)


def train_sentences(corpus: corpora.Corpus) -> tuple[list[str], list[str]]:
  """Every training source and target, each prepared as data.pretokenize says."""
  pretokenizer, sources, targets = Pretokenizer.of(corpus.cfg), [], []
  for chunk_sources, chunk_targets in corpus.train_chunks():
    sources += pretokenizer.source(chunk_sources)
    targets += pretokenizer.target(chunk_targets)
  return sources, targets
