"""Length buckets: the few padded widths that waste the least padding (one compiled
program each), and inference's batches sorted into them."""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

import numpy as np

from transformer_jax.config import round_up
from transformer_jax.data.parallel_data import pad


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
