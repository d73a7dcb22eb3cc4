"""Where sentence pairs come from: a dataset (data.task) is a Corpus, registered by its
module in transformer_jax/data/datasets/ (generated numbers, text files, TFDS,
Multi30k, or one of yours: docs/extending.md); `corpus(cfg)` makes the one a config
names. This module holds what every dataset shares: the Corpus interface, reading
text files, and dropping empty training pairs.

A Corpus returns a split as two aligned lists of strings (source, target), or, for a
training split of any size, streams it in chunks (`Corpus.train_chunks`) so that the
whole corpus is never held in memory; says what its training split is made from
(`identity`, for the token cache), what its test split is (`test_set`, and the paper's
figure on it); and checks what it can before loading anything. Text is checked here:
files of different line counts, bytes that are not UTF-8 (with file and line) and
empty lines are reported, never silently passed on.
"""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import logging
import os
import select
from typing import ClassVar, Iterable, Iterator

from etils import epath

from transformer_jax import files
from transformer_jax.config import DATASETS, DataConfig, InputError
from transformer_jax.config.fields import check

Pairs = tuple[list[str], list[str]]

# The paper's Table 2: BLEU (tokenized, compound-split: `bleu.paper_bleu`) of its base
# and big models on newstest2014, by language pair; a run whose test set is newstest2014
# (WMT14's through TFDS, or data.test_files) reports it beside its own (train.paper_row).
PAPER_TABLE_2 = {("base", "en-de"): 27.3, ("base", "en-fr"): 38.1,
                 ("big", "en-de"): 28.4, ("big", "en-fr"): 41.8}
PAPER_TEST_SET = "newstest2014"


def dataset(cfg: DataConfig) -> type[Corpus]:
  """The Corpus class that data.task names (its module imported now)."""
  return DATASETS.get(cfg.task, "config.data.task")


def corpus(cfg: DataConfig) -> Corpus:
  """The corpus `cfg` names, resolved once (`Corpus.of`: Multi30k from its plain files
  is text files). Nothing else decides by data.task."""
  return dataset(cfg).of(cfg)


def reads_tfds(cfg: DataConfig) -> bool:
  """Whether TFDS prepares and reads the corpus (from the config alone)."""
  return dataset(cfg).reads_tfds(cfg)


def named(cfg: DataConfig) -> str:
  """The training data as a reader would name it (a model card's line), from the config
  alone: the TFDS dataset, the training files, or the task."""
  return dataset(cfg).named(cfg)


def _iter_lines(path: str) -> Iterator[str]:
  """UTF-8 lines of a text file (optionally .gz), without line endings, one by one."""
  if not epath.Path(path).exists():
    raise InputError(f"{path} does not exist.")
  with epath.Path(path).open("rb") as raw_file:
    f = gzip.GzipFile(fileobj=raw_file) if path.endswith(".gz") else raw_file
    for number, raw in enumerate(f, start=1):
      try:
        yield raw.decode("utf-8").rstrip("\r\n")
      except UnicodeDecodeError as e:
        raise InputError(f"{path}:{number}: not valid UTF-8 ({e.reason} at byte "
                         f"{e.start} of the line).") from None


def read_lines(path: str) -> list[str]:
  """UTF-8 lines of a text file (optionally .gz), without line endings."""
  return list(_iter_lines(path))


def line_chunks(fd: int, max_lines: int) -> Iterator[list[bytes]]:
  """Complete lines from `fd` as they arrive: each chunk holds every line available
  without waiting (at most `max_lines`); it waits only when it has none."""
  buffer, lines, eof = b"", [], False
  while lines or not eof:
    if not eof and len(lines) < max_lines and (
        not lines or select.select([fd], [], [], 0)[0]):
      data = os.read(fd, 1 << 16)
      if data:
        *complete, buffer = (buffer + data).split(b"\n")
        lines += complete
      else:
        eof = True
        if buffer:  # A last line without "\n".
          lines.append(buffer)
      continue
    yield lines[:max_lines]
    lines = lines[max_lines:]


def decode_line(raw: bytes) -> str:
  """A line's UTF-8 text without a trailing "\r" (raises UnicodeDecodeError)."""
  text = raw.decode("utf-8")
  return text[:-1] if text.endswith("\r") else text


def read_parallel_files(source_path: str, target_path: str) -> Pairs:
  """Aligned lines of two files; their line counts must agree."""
  source, target = read_lines(source_path), read_lines(target_path)
  if len(source) != len(target):
    raise InputError(f"Parallel files differ in length: {source_path} has {len(source)} "
                     f"lines, {target_path} has {len(target)}.")
  return source, target


def iter_parallel_files(source_path: str, target_path: str) -> Iterator[tuple[str, str]]:
  """read_parallel_files, streamed: aligned pairs, one at a time."""
  missing = object()
  count = 0
  for source, target in itertools.zip_longest(_iter_lines(source_path),
                                              _iter_lines(target_path), fillvalue=missing):
    if source is missing or target is missing:
      longer = source_path if target is missing else target_path
      raise InputError(f"Parallel files differ in length: {longer} has more than the "
                       f"{count} lines of the other ({source_path}, {target_path}).")
    count += 1
    yield source, target


def non_empty(pairs: Iterable[tuple[str, str]]) -> Pairs:
  """The pairs whose sides both hold more than spaces, as two aligned lists: a pair
  with an empty side teaches nothing and is dropped from training."""
  kept = [(s, t) for s, t in pairs if s.strip() and t.strip()]
  return [s for s, _ in kept], [t for _, t in kept]


@dataclasses.dataclass(frozen=True)
class Corpus:
  """Sentence pairs of one dataset: its splits ("train", "eval", "test") as aligned
  lists, its training split streamed in chunks, what it is made from, its test set, and
  what can be checked before loading anything. A dataset is a subclass registered by
  its module in transformer_jax/data/datasets/ (`@DATASETS.register(NAME)`), which
  defines at least `identity` and `pairs`."""

  cfg: DataConfig  # As resolved by `of`.

  # The splits whose files (data.SPLIT_files) this dataset reads; any other's are refused.
  reads_files: ClassVar[tuple[str, ...]] = ()

  @classmethod
  def check(cls, cfg: DataConfig) -> None:
    """Raises InputError for a field this dataset cannot honour (DataConfig calls it):
    by default, data.SPLIT_files that it would ignore."""
    for split in ("train", "eval", "test"):
      if split not in cls.reads_files:
        name = f"{split}_files"
        check(not getattr(cfg, name), f"data.{name}", getattr(cfg, name),
              f"'' for data.task={cfg.task!r}, which reads no {split} files (ignored "
              "unless data.task='text': add --config.data.task=text to train on your own)")

  @classmethod
  def of(cls, cfg: DataConfig) -> Corpus:
    """The corpus for `cfg`, resolved once per run (a dataset that is really another,
    such as Multi30k's plain files read as text, returns that one)."""
    return cls(cfg)

  @classmethod
  def reads_tfds(cls, cfg: DataConfig) -> bool:
    """Whether TFDS prepares and reads it (the launchers then carry a TFDS folder)."""
    return False

  @classmethod
  def named(cls, cfg: DataConfig) -> str:
    """The training data as a reader would name it, from the config alone."""
    return cfg.task

  def check_available(self) -> None:
    """Raises InputError naming what is missing (files, TensorFlow, a dataset)."""

  def prepare(self, build: bool) -> tuple[bool, str] | None:
    """What a run reads of this corpus prepared before it starts (a TFDS dataset), as
    (built here now, where); None when it reads the source as it is. Without `build`,
    one not prepared raises NotPrepared."""
    return None

  def identity(self) -> dict:
    """What the training split is made from, for telling a changed corpus from the one
    a cache was built from."""
    raise NotImplementedError

  def pairs(self, split: str) -> Iterable[tuple[str, str]]:
    """The pairs of `split` ("train", "eval" or "test"), streamed where the source
    allows."""
    raise NotImplementedError

  def train_chunks(self, size: int = 100_000) -> Iterator[Pairs]:
    """The training pairs (empty sides dropped) in chunks of up to `size`: a corpus of
    any size passes through in bounded memory."""
    pairs = iter(self.pairs("train"))
    total = kept = 0
    while chunk := list(itertools.islice(pairs, size)):
      sources, targets = non_empty(chunk)
      total, kept = total + len(chunk), kept + len(sources)
      if sources:
        yield sources, targets
    if not kept:  # Nothing to train a tokenizer or a model on.
      raise InputError(f"{self.where()}: no training pairs ({total} lines, "
                       f"{total - kept} with an empty side).")
    if kept < total:
      logging.info("%s/train: dropped %d of %d pairs with an empty side.", self.cfg.task,
                   total - kept, total)

  def split(self, split: str) -> Pairs:
    """Sentence pairs of `split` ('train', 'eval' or 'test'); evaluation sets stay
    whole (dropping a line would change the benchmark)."""
    if split != "train":
      return self.whole(split)
    chunks = list(self.train_chunks())
    return ([s for sources, _ in chunks for s in sources],
            [t for _, targets in chunks for t in targets])

  def whole(self, split: str) -> Pairs:
    """`split` as two aligned lists, as the source holds it."""
    pairs = list(self.pairs(split))
    return [s for s, _ in pairs], [t for _, t in pairs]

  def where(self) -> str:
    """The training split's name in messages."""
    return f"{self.cfg.task}/train"

  def test_set(self) -> str | None:
    """The name of the test split (what the paper's tables call it): what `evaluate
    --split=test` and a run's final test line score; None when the data has none apart
    from its held-out split."""
    return None

  def no_test_set(self) -> str:
    """Why `test_set` is None, naming the field to set."""
    return f"task {self.cfg.task!r} has no test split apart from its held-out pairs"

  def paper_figure(self, row: str) -> float | None:
    """The paper's BLEU on this test set for its table's `row` (train.paper_row: "base",
    "big"), None where it reports none: Table 2's newstest2014 figures here."""
    if self.test_set() != PAPER_TEST_SET:
      return None
    return PAPER_TABLE_2.get((row, f"{self.cfg.source_lang}-{self.cfg.target_lang}"))


def file_pair(cfg: DataConfig, split: str) -> tuple[str, str]:
  """The source and target files that data.SPLIT_files names."""
  spec = getattr(cfg, f"{split}_files")
  parts = [p.strip() for p in spec.split(",")]
  if len(parts) != 2 or not all(parts):
    raise InputError(f"config.data.{split}_files={spec!r}: expected "
                     "'SOURCE_FILE,TARGET_FILE'.")
  return parts[0], parts[1]


def check_files(cfg: DataConfig, split: str) -> None:
  """Raises InputError unless both files of data.SPLIT_files exist and are readable."""
  for path in file_pair(cfg, split):
    if why := files.missing_filesystem(path):
      raise InputError(f"config.data.{split}_files: {path}: {why}")
    if not _readable_file(path):
      raise InputError(f"config.data.{split}_files: {path} does not exist or is not a "
                       "readable file.")


def named_test_files(cfg: DataConfig) -> str:
  """data.test_files' source file's name without its language and .gz: "newstest2014"."""
  name = os.path.basename(file_pair(cfg, "test")[0]).removesuffix(".gz")
  return name.removesuffix(f".{cfg.source_lang}")


def _readable_file(path: str) -> bool:
  try:
    with epath.Path(path).open("rb"):
      return not epath.Path(path).is_dir()
  except OSError:  # Missing, a directory, or no permission (local or remote).
    return False
