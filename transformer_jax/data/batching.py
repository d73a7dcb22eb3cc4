"""Tokenized parallel data, batched as a pure function of the step.

Batch `step` of a run is computed from (seed, step) alone: the example stream is a
fresh permutation of the corpus each epoch, seeded by (seed, epoch). A run resumed at
step k therefore sees exactly the batches an uninterrupted run sees from step k on,
with no iterator state to save, and batch k of epoch e is planned without touching
earlier epochs (token-budget and sentence batching; packing plans epochs in order).
The devices do not enter the plan: a run resumed on another number of devices,
processes or microbatches gets the same examples in the same order, plus at most
`row_multiple - 1` empty rows per batch so that the rows split evenly.

Batches are gathered with numpy from flat id arrays (memory-mapped for the training
split, see tokenized.py), never one Python object per token. Loading a task (corpora,
tokenizer, tokenization) is tasks.py; placing a batch on the devices is partitioning.py.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from transformer_jax.config import round_up, TrainConfig
from transformer_jax.data.tokenizer import EOS_ID, PAD_ID, Subwords


@dataclasses.dataclass(frozen=True, eq=False)  # Hashed by identity, for caching.
class Sequences:
  """Id sequences stored back to back: sequence i is tokens[starts[i]:][:lengths[i]]
  and ends in EOS (a truncated one has its last id read as EOS)."""

  tokens: np.ndarray  # Flat ids; may be a read-only memory map.
  starts: np.ndarray  # int64
  lengths: np.ndarray  # int32

  @classmethod
  def from_flat(cls, tokens: np.ndarray, lengths: np.ndarray) -> Sequences:
    starts = np.zeros(len(lengths), np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    return cls(tokens, starts, np.asarray(lengths, np.int32))

  @classmethod
  def from_list(cls, seqs: Sequence[Sequence[int]]) -> Sequences:
    lengths = np.array([len(s) for s in seqs], np.int32)
    tokens = np.concatenate([np.asarray(s, np.int32) for s in seqs]) if seqs else \
        np.zeros(0, np.int32)
    return cls.from_flat(tokens, lengths)

  def __len__(self) -> int:
    return len(self.lengths)

  def __getitem__(self, i: int) -> np.ndarray:
    return self.padded(np.array([i]), int(self.lengths[i]))[0]

  def select(self, indices: np.ndarray) -> Sequences:
    return Sequences(self.tokens, self.starts[indices], self.lengths[indices])

  def clipped(self, max_length: int) -> Sequences:
    return Sequences(self.tokens, self.starts, np.minimum(self.lengths, max_length))

  def padded(self, indices: np.ndarray, length: int) -> np.ndarray:
    """[len(indices), length] int32 rows, right-padded; index -1 gives an empty row."""
    indices = np.asarray(indices, np.int64)
    safe = np.maximum(indices, 0)
    lengths = np.where(indices >= 0, np.minimum(self.lengths[safe], length), 0)
    present = np.arange(length) < lengths[:, None]
    where = np.where(present, self.starts[safe][:, None] + np.arange(length), 0)
    out = np.zeros((len(indices), length), np.int32)
    if len(self.tokens):
      out[present] = self.tokens[where[present]]
    rows = np.nonzero(lengths)[0]
    out[rows, lengths[rows] - 1] = EOS_ID  # Already EOS unless truncated.
    return out


@dataclasses.dataclass(frozen=True, eq=False)  # Hashed by identity, for caching.
class ParallelData:
  """Source and target id sequences (each ending in EOS), aligned by index."""

  inputs: Sequences
  targets: Sequences

  def __post_init__(self):
    for side in ("inputs", "targets"):
      if not isinstance(getattr(self, side), Sequences):  # Lists of id sequences.
        object.__setattr__(self, side, Sequences.from_list(getattr(self, side)))

  def __len__(self) -> int:
    return len(self.inputs)

  def longer_side(self) -> np.ndarray:
    return np.maximum(self.inputs.lengths, self.targets.lengths)


def limit_length(data: ParallelData, max_length: int, name: str,
                 overlong: str) -> ParallelData:
  """Pairs with a side over `max_length` tokens dropped or truncated (keeping the final
  EOS), per `overlong`, and counted in the log."""
  long = data.longer_side() > max_length
  if long.any():
    logging.info("%s: %s %d of %d pairs longer than %d tokens.", name,
                 "dropped" if overlong == "drop" else "truncated", int(long.sum()),
                 len(data), max_length)
  if overlong == "drop":
    keep = np.nonzero(~long)[0]
    data = ParallelData(data.inputs.select(keep), data.targets.select(keep))
  else:
    data = ParallelData(data.inputs.clipped(max_length), data.targets.clipped(max_length))
  if not len(data):
    raise ValueError(f"{name}: no sentence pair fits data.max_length={max_length}.")
  return data


def encode_pairs(tokenizer: Subwords, sources: Sequence[str], targets: Sequence[str],
                 max_length: int, name: str = "data", overlong: str = "drop") -> ParallelData:
  """Tokenizes sentence pairs in memory (held-out sets, tests); see `limit_length`."""
  if len(sources) != len(targets):
    raise ValueError(f"{name}: {len(sources)} source but {len(targets)} target sentences.")
  data = ParallelData(Sequences.from_flat(*tokenizer.encode_flat(sources)),
                      Sequences.from_flat(*tokenizer.encode_flat(targets, target=True)))
  return limit_length(data, max_length, name, overlong)


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


def length_buckets(lengths: np.ndarray, max_buckets: int, multiple: int = 8) -> np.ndarray:
  """At most `max_buckets` padded lengths (multiples of `multiple`) for sequences of
  `lengths`, chosen to waste the fewest padding tokens (exact, by dynamic programming
  over the multiples that occur). Each bucket is one compiled train-step shape."""
  needed = round_up(np.asarray(lengths), multiple)
  values, counts = np.unique(needed, return_counts=True)
  if len(values) <= max_buckets:
    return values
  # cost[i, j]: padding when examples of values[i..j] all pad to values[j].
  cum_count = np.concatenate([[0], np.cumsum(counts)])
  cum_len = np.concatenate([[0], np.cumsum(counts * values)])
  n = len(values)
  cost = lambda i, j: values[j] * (cum_count[j + 1] - cum_count[i]) - (
      cum_len[j + 1] - cum_len[i])
  best = np.full((max_buckets + 1, n), np.inf)
  choice = np.zeros((max_buckets + 1, n), np.int64)
  for j in range(n):
    best[1, j] = cost(0, j)
  for k in range(2, max_buckets + 1):
    for j in range(n):
      for i in range(1, j + 1):  # The last bucket covers values[i..j].
        total = best[k - 1, i - 1] + cost(i, j)
        if total < best[k, j]:
          best[k, j], choice[k, j] = total, i
  ends, k, j = [], max_buckets, n - 1
  while j >= 0:
    ends.append(values[j])
    j = (choice[k, j] - 1) if k > 1 else -1
    k -= 1
  return np.array(sorted(ends))


def sorted_batches(lengths: Sequence[int], rows_for: Callable[[int], int],
                   max_width: int) -> Iterator[tuple[list[int], int, int]]:
  """Batches for inference (translation, scoring): (indices, width, rows) of each.

  Sequences are taken in order of length, each batch padded to the nearest of at most
  8 widths (multiples of 16 chosen for these lengths to waste the least padding, at
  most `max_width`), so at most 8 programs compile, and every batch but the last is
  full: as many sequences as `rows_for(width)` allows at the batch's width.
  """
  lengths = np.minimum(np.asarray(lengths, np.int64), max_width)
  if not len(lengths):
    return
  widths = np.unique(np.minimum(length_buckets(lengths, 8, 16), max_width))
  order = np.argsort(lengths, kind="stable")
  sorted_widths = widths[np.searchsorted(widths, lengths[order])].tolist()
  order = order.tolist()
  start = 0
  while start < len(order):
    end = start + 1  # Longer sequences join while the batch at their width has room.
    while end < len(order) and end - start < rows_for(sorted_widths[end]):
      end += 1
    width = sorted_widths[end - 1]
    yield order[start:end], width, rows_for(width)
    start = end


def padded_rows(seqs: Sequence[Sequence[int]], indices: Sequence[int], width: int,
                rows: int) -> np.ndarray:
  """Sequences `indices` of `seqs`, cut to `width` and padded into [rows, width]; the
  rows after them are empty."""
  picked = [np.asarray(seqs[i][:width], np.int32) for i in indices]
  return pad(picked + [np.zeros(0, np.int32)] * (rows - len(picked)), width)


def _token_budget_rows(max_tokens: int, length: int) -> int:
  """Pairs in a token-budget batch of padded length `length`: as many as fit."""
  return max(max_tokens // length, 1)


def over_budget(data: ParallelData, max_tokens: int) -> int:
  """How many pairs have a side longer than a token-budget batch of `max_tokens`: each
  is batched alone, over the budget (`_token_budget_rows` gives it one row)."""
  return int(np.sum(data.longer_side() > max_tokens))


def placed_rows(rows: int, row_multiple: int) -> int:
  """`rows` rounded up to a multiple of `row_multiple`, the rows a batch has on the
  devices; the extra rows are empty. The examples of a batch never depend on it."""
  return round_up(rows, row_multiple)


@dataclasses.dataclass(frozen=True)
class _BucketPlan:
  """Token-budget batching of one dataset: every epoch has the same batches per bucket,
  so batch k of epoch e is found without planning the epochs before it."""

  bucket: np.ndarray  # Per example: the index of its length bucket.
  lengths: np.ndarray  # Per bucket: the padded length.
  rows: np.ndarray  # Per bucket: rows per batch.
  counts: np.ndarray  # Per bucket: examples.
  batches: np.ndarray  # Per bucket: batches per epoch.

  @property
  def batches_per_epoch(self) -> int:
    return int(self.batches.sum())


@functools.lru_cache(maxsize=4)
def _bucket_plan(data: ParallelData, max_tokens: int, max_buckets: int) -> _BucketPlan:
  longer = data.longer_side()
  lengths = length_buckets(longer, max_buckets)
  bucket = np.searchsorted(lengths, longer)
  rows = np.array([_token_budget_rows(max_tokens, int(n)) for n in lengths])
  counts = np.bincount(bucket, minlength=len(lengths))
  return _BucketPlan(bucket, lengths, rows, counts, -(-counts // rows))


@functools.lru_cache(maxsize=2)
def _token_budget_epoch(data: ParallelData, max_tokens: int, max_buckets: int, seed: int,
                        epoch: int
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """One epoch in shuffled batches: (examples grouped by bucket, and per batch its
  padded length, first and last+1 position in that grouping).

  Within a bucket the examples keep the epoch's shuffled order; a batch of padded
  length L holds max_tokens // L pairs; the batches are then shuffled. All numpy, no per-pair loop.
  """
  plan = _bucket_plan(data, max_tokens, max_buckets)
  rng = np.random.default_rng([seed, epoch])
  order = rng.permutation(len(data))
  grouped = order[np.argsort(plan.bucket[order], kind="stable")]
  of_batch = np.repeat(np.arange(len(plan.lengths)), plan.batches)
  first_batch = np.cumsum(plan.batches) - plan.batches
  first_example = np.cumsum(plan.counts) - plan.counts
  k = np.arange(plan.batches_per_epoch) - first_batch[of_batch]
  starts = first_example[of_batch] + k * plan.rows[of_batch]
  stops = np.minimum(starts + plan.rows[of_batch],
                     first_example[of_batch] + plan.counts[of_batch])
  shuffled = rng.permutation(plan.batches_per_epoch)
  return grouped, plan.lengths[of_batch][shuffled], starts[shuffled], stops[shuffled]


@functools.lru_cache(maxsize=4)
def _packed_epoch(data: ParallelData, length: int, rows_per_batch: int, seed: int,
                  epoch: int) -> tuple[tuple[tuple[int, ...], ...], ...]:
  """One epoch of batches of packed rows; a row lists examples whose sources together
  fit in `length` tokens and whose targets do too. First fit over a few open rows, in
  a shuffled order: a loop over the pairs (about 1 s per million), planned epoch after
  epoch, unlike the token-budget batching."""
  order = np.random.default_rng([seed, epoch]).permutation(len(data)).tolist()
  src_lengths, tgt_lengths = data.inputs.lengths.tolist(), data.targets.lengths.tolist()
  open_rows: list[tuple[list[int], int, int]] = []  # (examples, source used, target used)
  rows = []
  for i in order:
    src, tgt = src_lengths[i], tgt_lengths[i]
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

  Its examples, and their order, are a pure function of (data, the batching fields,
  cfg.seed, step): resuming at step k gives exactly the batches an uninterrupted run
  sees, on any number of devices, processes or microbatches. `row_multiple` only adds
  empty rows at the end, so that the rows split evenly over the devices (`placed_rows`).
  """
  if cfg.batching == "sentences":
    idx = np.full(placed_rows(cfg.batch_size, row_multiple), -1)
    idx[:cfg.batch_size] = example_indices(len(data), step, cfg.batch_size, cfg.seed)
    return {"inputs": data.inputs.padded(idx, max_length),
            "targets": data.targets.padded(idx, max_length)}
  if cfg.batching == "packed":
    rows = list(_batch_at(step, _packed_epoch, data, max_length, cfg.batch_size, cfg.seed))
    # The epoch's last batch, and the devices' share: empty rows.
    rows += [()] * (placed_rows(cfg.batch_size, row_multiple) - len(rows))
    src = _pack_rows([[data.inputs[i] for i in row] for row in rows], max_length)
    tgt = _pack_rows([[data.targets[i] for i in row] for row in rows], max_length)
    return {"inputs": src["tokens"], "targets": tgt["tokens"],
            "inputs_segmentation": src["segmentation"],
            "targets_segmentation": tgt["segmentation"],
            "inputs_positions": src["positions"], "targets_positions": tgt["positions"]}
  # "tokens": similar lengths under a token budget (Sec. 5.1).
  plan = _bucket_plan(data, cfg.batch_tokens, cfg.max_length_buckets)
  epoch, k = divmod(step, plan.batches_per_epoch)
  grouped, lengths, starts, stops = _token_budget_epoch(
      data, cfg.batch_tokens, cfg.max_length_buckets, cfg.seed, epoch)
  length = int(lengths[k])
  idx = np.full(placed_rows(_token_budget_rows(cfg.batch_tokens, length), row_multiple), -1)
  idx[:stops[k] - starts[k]] = grouped[starts[k]:stops[k]]  # Short last batch: empty rows.
  return {"inputs": data.inputs.padded(idx, length),
          "targets": data.targets.padded(idx, length)}


def train_batch_shapes(data: ParallelData, cfg: TrainConfig, max_length: int,
                       row_multiple: int = 1) -> list[dict[str, tuple[int, int]]]:
  """Every shape `train_batch` can return for this data (one per length bucket with
  token budgets, a single one otherwise), without building an epoch."""
  return [{k: (placed_rows(rows, row_multiple), length) for k in keys}
          for rows, length, keys in _batch_layouts(data, cfg, max_length)]


def steps_per_epoch(data: ParallelData, cfg: TrainConfig) -> int:
  """The steps of one pass over `data` with token budgets: every epoch has the same."""
  return _bucket_plan(data, cfg.batch_tokens, cfg.max_length_buckets).batches_per_epoch


def empty_rows_added(data: ParallelData, cfg: TrainConfig, max_length: int,
                     row_multiple: int) -> tuple[int, float]:
  """The empty rows that `row_multiple` adds: (most in one batch, fraction of all rows
  of an epoch's batches, or of every batch when all have the same rows). Fewer than
  `row_multiple` per batch."""
  layouts = _batch_layouts(data, cfg, max_length)
  weights = (_bucket_plan(data, cfg.batch_tokens, cfg.max_length_buckets).batches
             if cfg.batching == "tokens" else [1])
  added = [placed_rows(rows, row_multiple) - rows for rows, _, _ in layouts]
  placed = [placed_rows(rows, row_multiple) for rows, _, _ in layouts]
  return max(added), float(np.dot(weights, added) / np.dot(weights, placed))


def _batch_layouts(data: ParallelData, cfg: TrainConfig, max_length: int
                   ) -> list[tuple[int, int, list[str]]]:
  """(rows of examples, padded length, keys) of each kind of batch, before devices."""
  if cfg.batching == "tokens":
    plan = _bucket_plan(data, cfg.batch_tokens, cfg.max_length_buckets)
    return [(int(r), int(n), ["inputs", "targets"]) for r, n in zip(plan.rows, plan.lengths)]
  keys = ["inputs", "targets"]
  if cfg.batching == "packed":
    keys += [f"{side}_{kind}" for kind in ("segmentation", "positions")
             for side in ("inputs", "targets")]
  return [(cfg.batch_size, max_length, keys)]


def clear_caches() -> None:
  """Forgets every planned epoch, as a fresh process would (for tests)."""
  for cached in (_bucket_plan, _token_budget_epoch, _packed_epoch, _num_batches,
                 _epoch_order):
    cached.cache_clear()


def eval_batches(data: ParallelData, batch_size: int,
                 length: int) -> Iterator[dict[str, np.ndarray]]:
  """The data in order, in full batches; the last one is padded with empty rows."""
  for start in range(0, len(data), batch_size):
    idx = np.arange(start, start + batch_size)
    idx[idx >= len(data)] = -1
    yield {"inputs": data.inputs.padded(idx, length),
           "targets": data.targets.padded(idx, length)}
