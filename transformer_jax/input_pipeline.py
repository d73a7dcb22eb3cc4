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
from typing import Any, Iterator, Sequence

import numpy as np

from transformer_jax import corpora
from transformer_jax import tokenizer as tokenizer_lib
from transformer_jax.config import DataConfig, TrainConfig
from transformer_jax.tokenizer import EOS_ID, PAD_ID, Tokenizer


@dataclasses.dataclass(frozen=True, eq=False)  # Hashed by identity, for caching.
class ParallelData:
  """Token id sequences (each ending in EOS), aligned by index."""

  inputs: list[np.ndarray]
  targets: list[np.ndarray]

  def __len__(self) -> int:
    return len(self.inputs)


def encode_pairs(tokenizer: Tokenizer, sources: Sequence[str], targets: Sequence[str],
                 max_length: int, name: str = "data", overlong: str = "drop") -> ParallelData:
  """Tokenizes sentence pairs; pairs with a side over `max_length` tokens are dropped
  or truncated (keeping the final EOS), per `overlong`, and counted in the log."""
  if len(sources) != len(targets):
    raise ValueError(f"{name}: {len(sources)} source but {len(targets)} target sentences.")
  src, tgt = tokenizer.encode(sources), tokenizer.encode(targets)
  long = [i for i, (s, t) in enumerate(zip(src, tgt))
          if len(s) > max_length or len(t) > max_length]
  if long:
    logging.info("%s: %s %d of %d pairs longer than %d tokens.", name,
                 "dropped" if overlong == "drop" else "truncated", len(long), len(src),
                 max_length)
  if overlong == "drop":
    skip = set(long)
    src = [s for i, s in enumerate(src) if i not in skip]
    tgt = [t for i, t in enumerate(tgt) if i not in skip]
  cut = lambda ids: ids if len(ids) <= max_length else ids[:max_length - 1] + [EOS_ID]
  if not src:
    raise ValueError(f"{name}: no sentence pair fits data.max_length={max_length}.")
  return ParallelData([np.asarray(cut(s), np.int32) for s in src],
                      [np.asarray(cut(t), np.int32) for t in tgt])


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


def _token_budget_rows(max_tokens: int, length: int, row_multiple: int) -> int:
  """Rows of a token-budget batch of padded length `length`: a multiple of
  `row_multiple` (so it splits evenly over devices), at least one multiple."""
  return max(max_tokens // length // row_multiple, 1) * row_multiple


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
    rows = _token_budget_rows(max_tokens, int(length), row_multiple)
    batches += [(int(length), members[i:i + rows]) for i in range(0, len(members), rows)]
  return tuple(batches[i] for i in rng.permutation(len(batches)))


@functools.lru_cache(maxsize=4)
def _packed_epoch(data: ParallelData, length: int, rows_per_batch: int, seed: int,
                  epoch: int) -> tuple[tuple[tuple[int, ...], ...], ...]:
  """One epoch of batches of packed rows; a row lists examples whose sources together
  fit in `length` tokens and whose targets do too. First fit over a few open rows, in
  a shuffled order."""
  order = np.random.default_rng([seed, epoch]).permutation(len(data))
  open_rows: list[tuple[list[int], int, int]] = []  # (examples, source used, target used)
  rows = []
  for i in order:
    src, tgt = len(data.inputs[i]), len(data.targets[i])
    for k, (members, used_src, used_tgt) in enumerate(open_rows):
      if used_src + src <= length and used_tgt + tgt <= length:
        open_rows[k] = (members + [int(i)], used_src + src, used_tgt + tgt)
        break
    else:
      if len(open_rows) == 8:  # Close the fullest row to keep the search short.
        fullest = max(range(8), key=lambda k: open_rows[k][1] + open_rows[k][2])
        rows.append(tuple(open_rows.pop(fullest)[0]))
      open_rows.append(([int(i)], src, tgt))
  rows += [tuple(members) for members, _, _ in open_rows]
  return tuple(tuple(rows[i:i + rows_per_batch]) for i in range(0, len(rows), rows_per_batch))


@functools.lru_cache(maxsize=None)
def _num_batches(epoch_batches, *args) -> int:
  """len(epoch_batches(*args)), remembered: walking to step k touches each epoch once."""
  return len(epoch_batches(*args))


def _batch_at(step: int, epoch_batches, *args) -> Any:
  """Batch `step` of the stream epoch_batches(*args, 0), epoch_batches(*args, 1), ..."""
  epoch = 0
  while step >= _num_batches(epoch_batches, *args, epoch):
    step -= _num_batches(epoch_batches, *args, epoch)
    epoch += 1
  return epoch_batches(*args, epoch)[step]


def _pack_rows(seqs: Sequence[Sequence[np.ndarray]], length: int) -> dict[str, np.ndarray]:
  """Rows of concatenated sequences with segment ids (1, 2, ...) and positions."""
  tokens = np.zeros((len(seqs), length), np.int32)
  segments, positions = np.zeros_like(tokens), np.zeros_like(tokens)
  for row, members in enumerate(seqs):
    at = 0
    for segment, seq in enumerate(members, start=1):
      tokens[row, at:at + len(seq)] = seq
      segments[row, at:at + len(seq)] = segment
      positions[row, at:at + len(seq)] = np.arange(len(seq))
      at += len(seq)
  return {"tokens": tokens, "segmentation": segments, "positions": positions}


def train_batch(data: ParallelData, step: int, cfg: TrainConfig, max_length: int,
                row_multiple: int = 1) -> dict[str, np.ndarray]:
  """Global batch number `step` (0-based) of the training stream, per `cfg.batching`.

  A pure function of (data, cfg.seed, step): resuming at step k gives exactly the
  batches an uninterrupted run sees. Row counts are multiples of `row_multiple`.
  """
  empty = np.zeros(0, np.int32)
  if cfg.batching == "sentences":
    idx = example_indices(len(data), step, cfg.batch_size, cfg.seed)
    return {"inputs": pad([data.inputs[i] for i in idx], max_length),
            "targets": pad([data.targets[i] for i in idx], max_length)}
  if cfg.batching == "packed":
    rows = list(_batch_at(step, _packed_epoch, data, max_length, cfg.batch_size, cfg.seed))
    rows += [()] * (cfg.batch_size - len(rows))  # The epoch's last batch: empty rows.
    src = _pack_rows([[data.inputs[i] for i in row] for row in rows], max_length)
    tgt = _pack_rows([[data.targets[i] for i in row] for row in rows], max_length)
    return {"inputs": src["tokens"], "targets": tgt["tokens"],
            "inputs_segmentation": src["segmentation"],
            "targets_segmentation": tgt["segmentation"],
            "inputs_positions": src["positions"], "targets_positions": tgt["positions"]}
  # "tokens": similar lengths under a token budget (Sec. 5.1).
  length, idx = _batch_at(step, _token_budget_epoch, data, cfg.batch_tokens, row_multiple,
                          cfg.seed)
  rows = _token_budget_rows(cfg.batch_tokens, length, row_multiple)
  idx = list(idx) + [None] * (rows - len(idx))  # The epoch's last batch: empty rows.
  return {"inputs": pad([empty if i is None else data.inputs[i] for i in idx], length),
          "targets": pad([empty if i is None else data.targets[i] for i in idx], length)}


def train_batch_shapes(data: ParallelData, cfg: TrainConfig, max_length: int,
                       row_multiple: int = 1) -> list[dict[str, tuple[int, int]]]:
  """Every shape `train_batch` can return for this data (one per length bucket with
  token budgets, a single one otherwise), without building an epoch."""
  if cfg.batching == "tokens":
    longest = np.maximum([len(x) for x in data.inputs], [len(y) for y in data.targets])
    lengths = np.unique(bucket_length(longest))
    shapes = [(_token_budget_rows(cfg.batch_tokens, int(n), row_multiple), int(n))
              for n in lengths]
    return [{"inputs": shape, "targets": shape} for shape in shapes]
  keys = ["inputs", "targets"]
  if cfg.batching == "packed":
    keys += [f"{side}_{kind}" for kind in ("segmentation", "positions")
             for side in ("inputs", "targets")]
  return [{k: (cfg.batch_size, max_length) for k in keys}]


def local_rows(batch: dict[str, np.ndarray], process_index: int,
               process_count: int) -> dict[str, np.ndarray]:
  """This process's disjoint share of the rows of a global batch."""
  rows = next(iter(batch.values())).shape[0]
  if rows % process_count:
    raise ValueError(f"A batch of {rows} rows does not split over {process_count} "
                     "processes.")
  share = rows // process_count
  return {k: v[process_index * share:(process_index + 1) * share] for k, v in batch.items()}


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
  """Loads and tokenizes the configured task; the tokenizer is trained once, on the
  training split, and kept in `workdir`."""
  src, tgt = corpora.load_split(cfg, "train")
  eval_src, eval_tgt = corpora.load_split(cfg, "eval")
  tok = tokenizer_lib.load_or_train(
      os.path.join(workdir, "tokenizer.model"), src + tgt, cfg.vocab_size,
      model_type=cfg.tokenizer_type, max_sentences=cfg.tokenizer_sentences)
  return Task(tokenizer=tok,
              train=encode_pairs(tok, src, tgt, cfg.max_length, f"{cfg.task}/train",
                                 cfg.overlong),
              eval=encode_pairs(tok, eval_src, eval_tgt, cfg.max_length, f"{cfg.task}/eval",
                                "truncate"),
              eval_sources=eval_src, eval_references=eval_tgt)
