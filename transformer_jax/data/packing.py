"""Packed batching (train.batching='packed'): several pairs a row, each side with segment
ids and positions that restart at each of its own sentences, so attention and the
position encodings keep the pairs apart."""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from transformer_jax.data.parallel_data import ParallelData


@functools.lru_cache(maxsize=4)
def packed_epoch(data: ParallelData, length: int, rows_per_batch: int, seed: int,
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


def pack_rows(seqs: Sequence[Sequence[np.ndarray]], length: int) -> dict[str, np.ndarray]:
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
