"""Tokenized parallel data held in memory, batched as a pure function of the step.

Batch `step` of a run is computed from (seed, step) alone: the example stream is a
fresh permutation of the corpus each epoch, seeded by (seed, epoch). A run resumed at
step k therefore sees exactly the batches an uninterrupted run sees from step k on,
with no iterator state to save.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from typing import Iterator, Sequence

import numpy as np

from transformer_jax import numbers
from transformer_jax import tokenizer as tokenizer_lib
from transformer_jax.config import DataConfig
from transformer_jax.tokenizer import PAD_ID, Tokenizer


@dataclasses.dataclass(frozen=True, eq=False)  # Hashed by identity, for caching.
class ParallelData:
  """Token id sequences (each ending in EOS), aligned by index."""

  inputs: list[np.ndarray]
  targets: list[np.ndarray]

  def __len__(self) -> int:
    return len(self.inputs)


def encode_pairs(tokenizer: Tokenizer, sources: Sequence[str], targets: Sequence[str],
                 max_length: int, name: str = "data") -> ParallelData:
  """Tokenizes sentence pairs, dropping pairs with a side over `max_length` tokens."""
  if len(sources) != len(targets):
    raise ValueError(f"{name}: {len(sources)} source but {len(targets)} target sentences.")
  src, tgt = tokenizer.encode(sources), tokenizer.encode(targets)
  keep = [i for i, (s, t) in enumerate(zip(src, tgt))
          if len(s) <= max_length and len(t) <= max_length]
  if len(keep) < len(src):
    logging.info("%s: dropped %d of %d pairs longer than %d tokens.", name,
                 len(src) - len(keep), len(src), max_length)
  if not keep:
    raise ValueError(f"{name}: no sentence pair fits data.max_length={max_length}.")
  as_array = lambda ids: np.asarray(ids, np.int32)
  return ParallelData([as_array(src[i]) for i in keep], [as_array(tgt[i]) for i in keep])


def pad(seqs: Sequence[np.ndarray], length: int) -> np.ndarray:
  """Right-pads id sequences with PAD_ID into [len(seqs), length]."""
  out = np.full((len(seqs), length), PAD_ID, np.int32)
  for row, seq in zip(out, seqs):
    row[: len(seq)] = seq
  return out


@functools.lru_cache(maxsize=4)
def _epoch_order(size: int, seed: int, epoch: int) -> np.ndarray:
  return np.random.default_rng([seed, epoch]).permutation(size)


def example_indices(size: int, step: int, batch_size: int, seed: int) -> np.ndarray:
  """Indices of the examples in batch `step`, reading epoch after shuffled epoch."""
  start = step * batch_size
  positions = np.arange(start, start + batch_size)
  epochs, offsets = np.divmod(positions, size)
  return np.array([_epoch_order(size, seed, int(e))[o] for e, o in zip(epochs, offsets)])


def bucket_length(length: int, multiple: int = 8) -> int:
  return -(-length // multiple) * multiple


@functools.lru_cache(maxsize=4)
def _token_budget_epoch(data: ParallelData, max_tokens: int, row_multiple: int, seed: int,
                        epoch: int) -> tuple[tuple[int, np.ndarray], ...]:
  """One epoch of (padded_length, example indices) batches, in shuffled order.

  Pairs are grouped by their longer side rounded up to a multiple of 8; a batch of
  padded length L holds max_tokens // L rows (a multiple of `row_multiple`, so it
  splits evenly over devices). Shapes are thus bounded by the number of buckets.
  """
  rng = np.random.default_rng([seed, epoch])
  order = rng.permutation(len(data))
  lengths = np.array([bucket_length(max(len(data.inputs[i]), len(data.targets[i])))
                      for i in order])
  batches = []
  for length in np.unique(lengths):
    members = order[lengths == length]
    rows = max(max_tokens // length // row_multiple, 1) * row_multiple
    batches += [(int(length), members[i:i + rows]) for i in range(0, len(members), rows)]
  return tuple(batches[i] for i in rng.permutation(len(batches)))


def train_batch(data: ParallelData, step: int, seed: int, *, batch_size: int,
                max_length: int, max_tokens: int = 0,
                row_multiple: int = 1) -> dict[str, np.ndarray]:
  """Batch number `step` (0-based) of the training stream.

  With `max_tokens` > 0, batches of similar-length pairs padded to about `max_tokens`
  tokens per side (the paper's batching, Sec. 5.1); otherwise `batch_size` pairs
  padded to `max_length`.
  """
  if max_tokens <= 0:
    idx = example_indices(len(data), step, batch_size, seed)
    length = max_length
  else:
    epoch = 0
    while step >= len(_token_budget_epoch(data, max_tokens, row_multiple, seed, epoch)):
      step -= len(_token_budget_epoch(data, max_tokens, row_multiple, seed, epoch))
      epoch += 1
    length, idx = _token_budget_epoch(data, max_tokens, row_multiple, seed, epoch)[step]
    rows = max(max_tokens // length // row_multiple, 1) * row_multiple
    idx = list(idx) + [None] * (rows - len(idx))  # The epoch's last batch: empty rows.
  empty = np.zeros(0, np.int32)
  return {"inputs": pad([empty if i is None else data.inputs[i] for i in idx], length),
          "targets": pad([empty if i is None else data.targets[i] for i in idx], length)}


def eval_batches(data: ParallelData, batch_size: int,
                 length: int) -> Iterator[dict[str, np.ndarray]]:
  """The data in order, in full batches; the last one is padded with empty rows."""
  for start in range(0, len(data), batch_size):
    stop = min(start + batch_size, len(data))
    filler = [np.zeros(0, np.int32)] * (batch_size - (stop - start))
    yield {"inputs": pad(data.inputs[start:stop] + filler, length),
           "targets": pad(data.targets[start:stop] + filler, length)}


@dataclasses.dataclass(frozen=True)
class Task:
  """What a run trains and evaluates on."""

  tokenizer: Tokenizer
  train: ParallelData
  eval: ParallelData  # Held-out pairs for the loss, tokenized.
  eval_sources: list[str]  # The same held-out pairs as text, for BLEU.
  eval_references: list[str]


def load_task(cfg: DataConfig, workdir: str) -> Task:
  """Builds the configured task; the tokenizer is trained once and kept in `workdir`."""
  if cfg.task != "numbers":
    raise ValueError(f"data.task={cfg.task!r} is not available; valid: 'numbers'.")
  src, tgt = numbers.make_split("train", cfg.num_train_examples, cfg.num_eval_examples)
  eval_src, eval_tgt = numbers.make_split("test", cfg.num_eval_examples,
                                          cfg.num_eval_examples)
  tok = tokenizer_lib.load_or_train(
      os.path.join(workdir, "tokenizer.model"), src + tgt, cfg.vocab_size,
      model_type=cfg.tokenizer_type)
  return Task(tokenizer=tok,
              train=encode_pairs(tok, src, tgt, cfg.max_length, "numbers/train"),
              eval=encode_pairs(tok, eval_src, eval_tgt, cfg.max_length, "numbers/test"),
              eval_sources=eval_src, eval_references=eval_tgt)
