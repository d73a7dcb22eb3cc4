"""Training batches as a pure function of the step.

Batch `step` of a run is computed from (seed, step) alone: the example stream is a
fresh permutation of the corpus each epoch, seeded by (seed, epoch). A run resumed at
step k therefore sees exactly the batches an uninterrupted run sees from step k on,
with no iterator state to save, and batch k of epoch e is planned without touching
earlier epochs (token-budget and sentence batching; packing plans epochs in order).
The devices do not enter the plan: a run resumed on another number of devices,
processes or microbatches gets the same examples in the same order, plus at most
`row_multiple - 1` empty rows per batch so that the rows split evenly.

Batches are gathered with numpy from flat id arrays (parallel_data.py); the length
buckets are buckets.py, packed rows packing.py. Loading a task (corpora, tokenizer,
tokenization) is tasks.py; placing a batch on the devices is partitioning.py.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Iterator

import numpy as np

from transformer_jax.config import round_up, TrainConfig
from transformer_jax.data import buckets, packing
from transformer_jax.data.parallel_data import ParallelData


@functools.lru_cache(maxsize=4)
def _epoch_order(size: int, seed: int, epoch: int) -> np.ndarray:
  return np.random.default_rng([seed, epoch]).permutation(size)


def example_indices(size: int, step: int, batch_size: int, seed: int) -> np.ndarray:
  """Indices of the examples in batch `step`, reading epoch after shuffled epoch."""
  start = step * batch_size
  positions = np.arange(start, start + batch_size)
  epochs, offsets = np.divmod(positions, size)
  return np.array([_epoch_order(size, seed, int(e))[o] for e, o in zip(epochs, offsets)])


# "real" counting: a batch of padded length L holds at most this many times
# train.batch_tokens positions, padding included, so that the largest batch is known
# without the data (planning/fit.py compiles it).
MAX_PADDED_RATIO = 1.5


def _padded_rows(max_tokens: int, length: int) -> int:
  """Pairs in a "padded" token-budget batch of padded length `length`: as many as fit."""
  return max(max_tokens // length, 1)


def _real_rows(max_tokens: int, length: int, mean_tokens: float) -> int:
  """Pairs in a "real" token-budget batch of padded length `length` whose pairs hold
  `mean_tokens` real tokens a side on average: about max_tokens real tokens a side,
  at most MAX_PADDED_RATIO x max_tokens positions."""
  cap = int(MAX_PADDED_RATIO * max_tokens) // length
  return max(min(round(max_tokens / mean_tokens), cap), 1)


def largest_rows(cfg: TrainConfig, length: int) -> int:
  """The most pairs a token-budget batch of padded length `length` can hold, whatever
  the data: the batch of that width that needs the most memory."""
  if cfg.batch_tokens_count == "padded":
    return _padded_rows(cfg.batch_tokens, length)
  return max(int(MAX_PADDED_RATIO * cfg.batch_tokens) // length, 1)


def over_budget(data: ParallelData, max_tokens: int) -> int:
  """How many pairs have a side longer than a token-budget batch of `max_tokens`: each
  is batched alone, over the budget (a batch has at least one row)."""
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


def _plan(data: ParallelData, cfg: TrainConfig) -> _BucketPlan:
  return _bucket_plan(data, cfg.batch_tokens, cfg.max_length_buckets, cfg.batch_tokens_count)


@functools.lru_cache(maxsize=4)
def _bucket_plan(data: ParallelData, max_tokens: int, max_buckets: int,
                 count: str) -> _BucketPlan:
  longer = data.longer_side()
  lengths = buckets.length_buckets(longer, max_buckets)
  bucket = np.searchsorted(lengths, longer)
  counts = np.bincount(bucket, minlength=len(lengths))
  if count == "padded":
    rows = np.array([_padded_rows(max_tokens, int(n)) for n in lengths])
  else:  # The mean of both sides' real tokens, per bucket.
    both = (data.inputs.lengths + data.targets.lengths).astype(np.float64)
    tokens = np.bincount(bucket, both, minlength=len(lengths)) / 2
    rows = np.array([_real_rows(max_tokens, int(n), t / max(c, 1))
                     for n, t, c in zip(lengths, tokens, counts)])
  return _BucketPlan(bucket, lengths, rows, counts, -(-counts // rows))


@functools.lru_cache(maxsize=2)
def _token_budget_epoch(data: ParallelData, cfg: TrainConfig, epoch: int
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """One epoch in shuffled batches: (examples grouped by bucket, and per batch its
  bucket, first and last+1 position in that grouping).

  Within a bucket the examples keep the epoch's shuffled order; a batch of bucket b
  holds the plan's rows[b] pairs; the batches are then shuffled. All numpy, no per-pair
  loop.
  """
  plan = _plan(data, cfg)
  rng = np.random.default_rng([cfg.seed, epoch])
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
  return grouped, of_batch[shuffled], starts[shuffled], stops[shuffled]


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
    rows = list(_batch_at(step, packing.packed_epoch, data, max_length, cfg.batch_size, cfg.seed))
    # The epoch's last batch, and the devices' share: empty rows.
    rows += [()] * (placed_rows(cfg.batch_size, row_multiple) - len(rows))
    src = packing.pack_rows([[data.inputs[i] for i in row] for row in rows], max_length)
    tgt = packing.pack_rows([[data.targets[i] for i in row] for row in rows], max_length)
    return {"inputs": src["tokens"], "targets": tgt["tokens"],
            "inputs_segmentation": src["segmentation"],
            "targets_segmentation": tgt["segmentation"],
            "inputs_positions": src["positions"], "targets_positions": tgt["positions"]}
  # "tokens": similar lengths under a token budget (Sec. 5.1).
  plan = _plan(data, cfg)
  epoch, k = divmod(step, plan.batches_per_epoch)
  grouped, bucket, starts, stops = _token_budget_epoch(data, cfg, epoch)
  length = int(plan.lengths[bucket[k]])
  idx = np.full(placed_rows(int(plan.rows[bucket[k]]), row_multiple), -1)
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
  return _plan(data, cfg).batches_per_epoch


def padding_fraction(data: ParallelData, cfg: TrainConfig) -> float:
  """With token budgets: the fraction of the padded positions of the longer sides that
  is padding (the empty rows of an epoch's last batches not counted)."""
  plan = _plan(data, cfg)
  padded = plan.lengths[plan.bucket]
  return float((padded - data.longer_side()).sum() / padded.sum())


def real_tokens_per_batch(data: ParallelData, cfg: TrainConfig, max_length: int
                          ) -> tuple[float, float]:
  """The mean real (non-padding) source and target tokens of a batch over an epoch."""
  if cfg.batching == "tokens":
    batches = steps_per_epoch(data, cfg)
  elif cfg.batching == "packed":
    batches = _num_batches(packing.packed_epoch, data, max_length, cfg.batch_size, cfg.seed, 0)
  else:
    batches = len(data) / cfg.batch_size
  return tuple(float(np.minimum(side.lengths, max_length).sum() / batches)
               for side in (data.inputs, data.targets))


def empty_rows_added(data: ParallelData, cfg: TrainConfig, max_length: int,
                     row_multiple: int) -> tuple[int, float]:
  """The empty rows that `row_multiple` adds: (most in one batch, fraction of all rows
  of an epoch's batches, or of every batch when all have the same rows). Fewer than
  `row_multiple` per batch."""
  layouts = _batch_layouts(data, cfg, max_length)
  weights = (_plan(data, cfg).batches
             if cfg.batching == "tokens" else [1])
  added = [placed_rows(rows, row_multiple) - rows for rows, _, _ in layouts]
  placed = [placed_rows(rows, row_multiple) for rows, _, _ in layouts]
  return max(added), float(np.dot(weights, added) / np.dot(weights, placed))


def largest_batch_shapes(cfg: TrainConfig, max_length: int, row_multiple: int = 1
                         ) -> dict[str, tuple[int, int]]:
  """The shapes of the batch that needs the most memory, whatever the data: as many
  rows of max_length as `train.batching` ever puts in one batch (what fit checks
  compile)."""
  (rows, length, keys), = _batch_layouts(None, cfg, max_length)
  return {k: (placed_rows(rows, row_multiple), length) for k in keys}


def _batch_layouts(data: ParallelData | None, cfg: TrainConfig, max_length: int
                   ) -> list[tuple[int, int, list[str]]]:
  """(rows of examples, padded length, keys) of each kind of batch, before devices;
  with no data, only the largest."""
  keys = ["inputs", "targets"]
  if cfg.batching == "tokens" and data is None:
    return [(largest_rows(cfg, max_length), max_length, keys)]
  if cfg.batching == "tokens":
    plan = _plan(data, cfg)
    return [(int(r), int(n), keys) for r, n in zip(plan.rows, plan.lengths)]
  if cfg.batching == "packed":
    keys += [f"{side}_{kind}" for kind in ("segmentation", "positions")
             for side in ("inputs", "targets")]
  return [(cfg.batch_size, max_length, keys)]


def clear_caches() -> None:
  """Forgets every planned epoch, as a fresh process would (for tests)."""
  for cached in (_bucket_plan, _token_budget_epoch, packing.packed_epoch, _num_batches,
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
