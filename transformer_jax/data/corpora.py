"""Where sentence pairs come from: generated, TFDS (WMT, Multi30k) or plain text files.
Multi30k from a folder of its plain files (`data.manual_dir`) is read as text files,
without TensorFlow.

`corpus(cfg)` resolves the config once into one Corpus: NumberWords, TextFiles or
TfdsDataset. Each returns a split as two aligned lists of strings (source, target), or,
for a training split of any size, streams it in chunks (`Corpus.train_chunks`) so that
the whole corpus is never held in memory; says what its training split is made from
(`identity`, for the token cache); and checks what it can before loading anything. Text is checked here: files of different line counts,
bytes that are not UTF-8 (with file and line) and empty lines are reported, never
silently passed on.
"""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import logging
import os
import select
from typing import Iterable, Iterator

from etils import epath

from transformer_jax import files, stop_policy
from transformer_jax.config import DataConfig, InputError, NotPrepared
from transformer_jax.data import multi30k, number_words

Pairs = tuple[list[str], list[str]]


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


def _iter_parallel_files(source_path: str, target_path: str) -> Iterator[tuple[str, str]]:
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


def drop_empty(pairs: Pairs, name: str) -> Pairs:
  """Removes pairs with an empty (or all-space) side, and says how many."""
  kept = [(s, t) for s, t in zip(*pairs) if s.strip() and t.strip()]
  if len(kept) < len(pairs[0]):
    logging.info("%s: dropped %d of %d pairs with an empty side.", name,
                 len(pairs[0]) - len(kept), len(pairs[0]))
  return [s for s, _ in kept], [t for _, t in kept]


def _tfds(task: str):
  """tensorflow_datasets, which prepares and reads its datasets with TensorFlow: both are
  imported only here, by the TFDS sources, or named in a one-line error."""
  try:
    with stop_policy.stops_held():
      import tensorflow  # noqa: F401
      import tensorflow_datasets as tfds
  except ImportError as e:
    raise InputError(f"config.data.task={task!r} reads a TFDS dataset, which needs "
                     f"TensorFlow and tensorflow-datasets ({e}): pip install "
                     "'transformer-jax[tfds]' (in a clone: pip install -e '.[tfds]').") from e
  return tfds


def _tfds_builder(name: str, cfg: DataConfig):
  """The TFDS builder of `name`, checked to have both languages (nothing downloaded)."""
  tfds = _tfds(cfg.task)
  if name == "multi30k":
    from transformer_jax.data.multi30k import builder as multi30k_builder  # Registers it.
    builder = multi30k_builder.Multi30k(data_dir=cfg.tfds_data_dir or None)
  else:
    try:
      builder = tfds.builder(name, data_dir=cfg.tfds_data_dir or None)
    except Exception as e:  # TFDS names the unknown dataset or config and close matches.
      raise InputError(f"config.data.tfds_name={name!r}: {str(e).splitlines()[0]}") from e
  languages = set(builder.info.features.keys())
  for lang in (cfg.source_lang, cfg.target_lang):
    if lang not in languages:
      raise InputError(f"data.source_lang/target_lang: {name} has languages "
                       f"{sorted(languages)}, not {lang!r}.")
  return builder


def _prepared_builder(cfg: DataConfig, name: str, build: bool = True):
  """(the TFDS builder of `name`, whether its dataset was built now): one prepared
  before is read; else it is downloaded and built here, into data.tfds_data_dir, when
  `build` says so, and is NotPrepared when not."""
  builder = _tfds_builder(name, cfg)
  if builder.is_prepared():
    return builder, False
  if not build:
    raise NotPrepared(f"the TFDS dataset {name} is not prepared in {builder.data_dir} "
                      f"(config.data.tfds_data_dir={cfg.tfds_data_dir!r})")
  tfds = _tfds(cfg.task)
  download_config = tfds.download.DownloadConfig(manual_dir=cfg.manual_dir or None)
  builder.download_and_prepare(download_config=download_config)
  return builder, True


def _iter_tfds(cfg: DataConfig, name: str, split: str) -> Iterator[tuple[str, str]]:
  tfds = _tfds(cfg.task)
  builder, _ = _prepared_builder(cfg, name)
  for example in tfds.as_numpy(builder.as_dataset(split=split)):
    yield (example[cfg.source_lang].decode("utf-8"),
           example[cfg.target_lang].decode("utf-8"))


def reads_tfds(cfg: DataConfig) -> bool:
  """Whether TFDS prepares and reads the corpus (Multi30k from data.manual_dir is read
  as text files: `resolve`)."""
  return cfg.task == "tfds" or (cfg.task == "multi30k" and not cfg.manual_dir)


def resolve(cfg: DataConfig) -> DataConfig:
  """Where the data really comes from: Multi30k from `data.manual_dir`'s plain files
  (train, val and test_2016_flickr, .en.gz and .de.gz), each checked once against the
  release's checksums, becomes the same files read as task "text"."""
  if cfg.task != "multi30k" or reads_tfds(cfg):
    return cfg
  paths = {f"{split}_files": [os.path.join(cfg.manual_dir, f"{stem}.{lang}.gz")
                              for lang in (cfg.source_lang, cfg.target_lang)]
           for split, stem in multi30k.SPLITS.items()}
  if missing := [os.path.basename(p) for pair in paths.values() for p in pair
                 if not os.path.isfile(p)]:
    raise InputError(f"config.data.manual_dir={cfg.manual_dir!r} lacks {', '.join(missing)} "
                     "(Multi30k task 1's raw files: train, val and test_2016_flickr, "
                     ".en.gz and .de.gz).")
  if cfg.test_files:  # The user's test set, not the release's.
    del paths["test_files"]
  return dataclasses.replace(cfg, task="text", manual_dir="", **{
      field: ",".join(multi30k.verified(p) for p in pair) for field, pair in paths.items()})


def named(cfg: DataConfig) -> str:
  """The training data as a reader would name it (a model card's line), from the config
  alone: the TFDS dataset, the training files, or the task."""
  return {"tfds": cfg.tfds_name, "text": cfg.train_files}.get(cfg.task, cfg.task)


def corpus(cfg: DataConfig) -> Corpus:
  """The corpus `cfg` names, resolved once (`resolve`): generated number words, text
  files or a TFDS dataset. Nothing else decides by data.task."""
  cfg = resolve(cfg)
  if cfg.task == "numbers":
    return NumberWords(cfg)
  if cfg.task == "text":
    return TextFiles(cfg)
  return TfdsDataset(cfg)


@dataclasses.dataclass(frozen=True)
class Corpus:
  """Sentence pairs of one source: its splits ("train", "eval", "test") as aligned
  lists, its training split streamed in chunks, what it is made from, and what can be
  checked before loading anything."""

  cfg: DataConfig  # Resolved: task "numbers", "text", "tfds" or "multi30k" (TFDS's).

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
    """The pairs of `split`, streamed where the source allows."""
    raise NotImplementedError

  def train_chunks(self, size: int = 100_000) -> Iterator[Pairs]:
    """The training pairs (empty sides dropped) in chunks of up to `size`: a corpus of
    any size passes through in bounded memory."""
    pairs = iter(self.pairs("train"))
    total = dropped = 0
    while chunk := list(itertools.islice(pairs, size)):
      total += len(chunk)
      kept = [(s, t) for s, t in chunk if s.strip() and t.strip()]
      dropped += len(chunk) - len(kept)
      if kept:
        yield [s for s, _ in kept], [t for _, t in kept]
    if total == dropped:  # Nothing to train a tokenizer or a model on.
      raise InputError(f"{self.where()}: no training pairs ({total} lines, "
                       f"{dropped} with an empty side).")
    if dropped:
      logging.info("%s/train: dropped %d of %d pairs with an empty side.", self.cfg.task,
                   dropped, total)

  def split(self, split: str) -> Pairs:
    """Sentence pairs of `split` ('train', 'eval' or 'test'); evaluation sets stay
    whole (dropping a line would change the benchmark)."""
    pairs = self.whole(split)
    return drop_empty(pairs, f"{self.cfg.task}/{split}") if split == "train" else pairs

  def whole(self, split: str) -> Pairs:
    """`split` as two aligned lists, as the source holds it."""
    pairs = list(self.pairs(split))
    return [s for s, _ in pairs], [t for _, t in pairs]

  def where(self) -> str:
    """The training split's name in messages."""
    return f"{self.cfg.task}/train"

  def test_set(self) -> str | None:
    """The name of the test split (what the paper's tables call it), or None when the
    data has none apart from its held-out split."""
    return None

  def no_test_set(self) -> str:
    """Why `test_set` is None, naming the field to set."""
    return f"task {self.cfg.task!r} has no test split apart from its held-out pairs"


class NumberWords(Corpus):
  """Number words, English to German, generated (number_words.py): no download."""

  def identity(self) -> dict:
    return {"task": "numbers", "train": self.cfg.num_train_examples,
            "held_out": self.cfg.num_eval_examples}

  def pairs(self, split: str) -> Iterable[tuple[str, str]]:
    train = split == "train"
    count = self.cfg.num_train_examples if train else self.cfg.num_eval_examples
    return zip(*number_words.make_split("train" if train else "test", count,
                                        self.cfg.num_eval_examples))


class TextFiles(Corpus):
  """Aligned plain-text files (optionally .gz), local or remote: data.train_files,
  eval_files and test_files, each 'SOURCE_FILE,TARGET_FILE'."""

  def files(self, split: str) -> tuple[str, str]:
    return _files(getattr(self.cfg, f"{split}_files"), f"{split}_files")

  def check_available(self) -> None:
    """The train and eval splits' files, and the test split's if given, exist and are
    readable."""
    for split in ("train", "eval", "test")[:3 if self.cfg.test_files else 2]:
      _check_files(self.cfg, split)

  def identity(self) -> dict:
    """The training files' paths, sizes and modification times."""
    paths = [epath.Path(p) for p in self.files("train")]
    return {"task": "text", "files": [[os.fspath(p), p.stat().length, p.stat().mtime]
                                      for p in paths]}

  def pairs(self, split: str) -> Iterable[tuple[str, str]]:
    return _iter_parallel_files(*self.files(split))

  def whole(self, split: str) -> Pairs:
    return read_parallel_files(*self.files(split))

  def where(self) -> str:
    return f"config.data.train_files={self.cfg.train_files!r}"

  def test_set(self) -> str | None:
    return _test_files_name(self.cfg) if self.cfg.test_files else None

  def no_test_set(self) -> str:
    return "config.data.test_files is empty: the data has no test split"


class TfdsDataset(Corpus):
  """A TFDS dataset (data.tfds_name, or Multi30k's builder for task "multi30k"),
  prepared and read by TFDS with TensorFlow; its test split, or data.test_files (the
  test set from elsewhere, e.g. newstest2014 from sacreBLEU)."""

  @property
  def name(self) -> str:
    return "multi30k" if self.cfg.task == "multi30k" else self.cfg.tfds_name

  def check_available(self) -> None:
    """TFDS is installed, and a TFDS dataset exists and has both languages."""
    if self.cfg.task == "multi30k":
      _tfds(self.cfg.task)
    else:
      _tfds_builder(self.name, self.cfg)
    if self.cfg.test_files:
      _check_files(self.cfg, "test")

  def prepare(self, build: bool) -> tuple[bool, str]:
    builder, built = _prepared_builder(self.cfg, self.name, build)
    return built, f"the TFDS dataset {self.name} in {builder.data_dir}"

  def identity(self) -> dict:
    """The TFDS dataset, its version, split and languages."""
    builder = _tfds_builder(self.name, self.cfg)
    return {"task": "tfds", "name": self.name.split(":")[0],  # The version follows.
            "version": str(builder.info.version),
            "split": self.cfg.train_split,
            "languages": [self.cfg.source_lang, self.cfg.target_lang]}

  def pairs(self, split: str) -> Iterable[tuple[str, str]]:
    tfds_split = {"train": self.cfg.train_split, "eval": self.cfg.eval_split,
                  "test": self.cfg.test_split}[split]
    if split == "test" and self.cfg.test_files:
      return _iter_parallel_files(*_files(self.cfg.test_files, "test_files"))
    return _iter_tfds(self.cfg, self.name, tfds_split)

  def test_set(self) -> str | None:
    """The test sets the builder says its test split is made of (a WMT builder's
    `subsets`: WMT14's "test" is newstest2014), Multi30k's file stem, or NAME:SPLIT;
    data.test_files' name where they replace the split."""
    if self.cfg.test_files:
      return _test_files_name(self.cfg)
    split = self.cfg.test_split
    if not split:
      return None
    if self.cfg.task == "multi30k":
      return multi30k.SPLITS["test"] if split == "test" else f"multi30k:{split}"
    subsets = getattr(_tfds_builder(self.name, self.cfg), "subsets", {}).get(split)
    return "+".join(subsets) if subsets else f"{self.name}:{split}"

  def no_test_set(self) -> str:
    return "config.data.test_split is empty: the data has no test split"


def _files(spec: str, field: str) -> tuple[str, str]:
  parts = [p.strip() for p in spec.split(",")]
  if len(parts) != 2 or not all(parts):
    raise InputError(f"config.data.{field}={spec!r}: expected 'SOURCE_FILE,TARGET_FILE'.")
  return parts[0], parts[1]


def _check_files(cfg: DataConfig, split: str) -> None:
  """Raises InputError unless both files of data.SPLIT_files exist and are readable."""
  for path in _files(getattr(cfg, f"{split}_files"), f"{split}_files"):
    if why := files.missing_filesystem(path):
      raise InputError(f"config.data.{split}_files: {path}: {why}")
    if not _readable_file(path):
      raise InputError(f"config.data.{split}_files: {path} does not exist or is not a "
                       "readable file.")


def _test_files_name(cfg: DataConfig) -> str:
  """data.test_files' source file's name without its language and .gz: "newstest2014"."""
  name = os.path.basename(_files(cfg.test_files, "test_files")[0]).removesuffix(".gz")
  return name.removesuffix(f".{cfg.source_lang}")


def _readable_file(path: str) -> bool:
  try:
    with epath.Path(path).open("rb"):
      return not epath.Path(path).is_dir()
  except OSError:  # Missing, a directory, or no permission (local or remote).
    return False
