"""Tokenized parallel data as flat id arrays (memory-mapped for the training split,
see tokenized.py): never one Python object per token."""

from __future__ import annotations

import dataclasses
import logging
from typing import Sequence

import numpy as np

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
