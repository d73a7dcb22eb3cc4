"""Where sentence pairs come from: generated, TFDS (WMT, Multi30k) or plain text files.
Multi30k from a folder of its plain files (`data.manual_dir`) is read as text files,
without TensorFlow.

Every source returns a split as two aligned lists of strings (source, target), or, for
a training split of any size, streams it in chunks (`train_chunks`) so that the whole
corpus is never held in memory. Text is checked here: files of different line counts,
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

from transformer_jax import files
from transformer_jax.config import DataConfig, InputError
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
    with files.stops_held():
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


def _iter_tfds(cfg: DataConfig, name: str, split: str) -> Iterator[tuple[str, str]]:
  tfds = _tfds(cfg.task)
  builder = _tfds_builder(name, cfg)
  download_config = tfds.download.DownloadConfig(manual_dir=cfg.manual_dir or None)
  builder.download_and_prepare(download_config=download_config)
  for example in tfds.as_numpy(builder.as_dataset(split=split)):
    yield (example[cfg.source_lang].decode("utf-8"),
           example[cfg.target_lang].decode("utf-8"))


def _tfds_pairs(name: str, split: str, cfg: DataConfig) -> Pairs:
  pairs = list(_iter_tfds(cfg, name, split))
  return [s for s, _ in pairs], [t for _, t in pairs]


def resolve(cfg: DataConfig) -> DataConfig:
  """Where the data really comes from, decided once (a run's preflight does it and hands
  the result down; the functions below take either): Multi30k from `data.manual_dir`'s
  plain files (train, val and test_2016_flickr, .en.gz and .de.gz), each checked once
  against the release's checksums, becomes the same files read as task "text"."""
  if cfg.task != "multi30k" or not cfg.manual_dir:
    return cfg
  paths = {f"{split}_files": [os.path.join(cfg.manual_dir, f"{stem}.{lang}.gz")
                              for lang in (cfg.source_lang, cfg.target_lang)]
           for split, stem in multi30k.SPLITS.items()}
  if missing := [os.path.basename(p) for pair in paths.values() for p in pair
                 if not os.path.isfile(p)]:
    raise InputError(f"config.data.manual_dir={cfg.manual_dir!r} lacks {', '.join(missing)} "
                     "(Multi30k task 1's raw files: train, val and test_2016_flickr, "
                     ".en.gz and .de.gz).")
  return dataclasses.replace(cfg, task="text", manual_dir="", **{
      field: ",".join(multi30k.verified(p) for p in pair) for field, pair in paths.items()})


def _files(spec: str, field: str) -> tuple[str, str]:
  parts = [p.strip() for p in spec.split(",")]
  if len(parts) != 2 or not all(parts):
    raise InputError(f"config.data.{field}={spec!r}: expected 'SOURCE_FILE,TARGET_FILE'.")
  return parts[0], parts[1]


def _readable_file(path: str) -> bool:
  try:
    with epath.Path(path).open("rb"):
      return not epath.Path(path).is_dir()
  except OSError:  # Missing, a directory, or no permission (local or remote).
    return False


def check_available(cfg: DataConfig) -> None:
  """What can be checked before loading anything: the text files of the train and eval
  splits exist and are readable; TFDS is installed, and a TFDS dataset exists and has
  both languages."""
  cfg = resolve(cfg)
  if cfg.task == "text":
    for field in ("train_files", "eval_files"):
      for path in _files(getattr(cfg, field), field):
        if why := files.missing_filesystem(path):
          raise InputError(f"config.data.{field}: {path}: {why}")
        if not _readable_file(path):
          raise InputError(f"config.data.{field}: {path} does not exist or is not a "
                           "readable file.")
  elif cfg.task == "tfds":
    _tfds_builder(cfg.tfds_name, cfg)
  elif cfg.task == "multi30k":
    _tfds(cfg.task)


def identity(cfg: DataConfig) -> dict:
  """What the training split is made from, for telling a changed corpus from the one a
  cache was built from: the generator's settings, the TFDS dataset and version, or the
  text files' paths, sizes and modification times."""
  cfg = resolve(cfg)
  if cfg.task == "numbers":
    return {"task": "numbers", "train": cfg.num_train_examples,
            "held_out": cfg.num_eval_examples}
  if cfg.task == "text":
    files = [epath.Path(p) for p in _files(cfg.train_files, "train_files")]
    return {"task": "text", "files": [[os.fspath(p), p.stat().length, p.stat().mtime]
                                      for p in files]}
  name = "multi30k" if cfg.task == "multi30k" else cfg.tfds_name
  builder = _tfds_builder(name, cfg)
  return {"task": "tfds", "name": name, "version": str(builder.info.version),
          "split": cfg.train_split, "languages": [cfg.source_lang, cfg.target_lang]}


def train_chunks(cfg: DataConfig, size: int = 100_000) -> Iterator[Pairs]:
  """The training pairs (empty sides dropped) in chunks of up to `size`, streamed from
  text files and TFDS: a corpus of any size passes through in bounded memory."""
  cfg = resolve(cfg)
  if cfg.task == "numbers":
    pairs: Iterable[tuple[str, str]] = zip(*load_split(cfg, "train"))
  elif cfg.task == "text":
    pairs = _iter_parallel_files(*_files(cfg.train_files, "train_files"))
  else:
    pairs = _iter_tfds(cfg, "multi30k" if cfg.task == "multi30k" else cfg.tfds_name,
                       cfg.train_split)
  total = dropped = 0
  while chunk := list(itertools.islice(pairs, size)):
    total += len(chunk)
    kept = [(s, t) for s, t in chunk if s.strip() and t.strip()]
    dropped += len(chunk) - len(kept)
    if kept:
      yield [s for s, _ in kept], [t for _, t in kept]
  if total == dropped:  # Nothing to train a tokenizer or a model on.
    where = (f"config.data.train_files={cfg.train_files!r}" if cfg.task == "text"
             else f"{cfg.task}/train")
    raise InputError(f"{where}: no training pairs ({total} lines, "
                     f"{dropped} with an empty side).")
  if dropped:
    logging.info("%s/train: dropped %d of %d pairs with an empty side.", cfg.task, dropped,
                 total)


def load_split(cfg: DataConfig, split: str) -> Pairs:
  """Sentence pairs of `split` ('train', 'eval' or 'test') of the configured task."""
  cfg = resolve(cfg)
  name = f"{cfg.task}/{split}"
  if cfg.task == "numbers":
    count = cfg.num_train_examples if split == "train" else cfg.num_eval_examples
    return number_words.make_split("train" if split == "train" else "test", count,
                              cfg.num_eval_examples)
  if cfg.task == "text":
    field = f"{split}_files"
    pairs = read_parallel_files(*_files(getattr(cfg, field), field))
  else:
    tfds_split = {"train": cfg.train_split, "eval": cfg.eval_split,
                  "test": cfg.test_split}[split]
    tfds_name = "multi30k" if cfg.task == "multi30k" else cfg.tfds_name
    pairs = _tfds_pairs(tfds_name, tfds_split, cfg)
  # Evaluation sets stay whole: dropping a line would change the benchmark.
  return drop_empty(pairs, name) if split == "train" else pairs
