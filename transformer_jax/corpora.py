"""Where sentence pairs come from: generated, TFDS (WMT, Multi30k) or plain text files.

Every source returns a split as two aligned lists of strings (source, target). Text
is checked here: files of different line counts, bytes that are not UTF-8 (with file
and line) and empty lines are reported, never silently passed on.
"""

from __future__ import annotations

import gzip
import logging

from etils import epath

from transformer_jax import numbers
from transformer_jax.config import DataConfig, InputError

Pairs = tuple[list[str], list[str]]


def read_lines(path: str) -> list[str]:
  """UTF-8 lines of a text file (optionally .gz), without line endings."""
  if not epath.Path(path).exists():
    raise InputError(f"{path} does not exist.")
  lines = []
  with epath.Path(path).open("rb") as raw_file:
    f = gzip.GzipFile(fileobj=raw_file) if path.endswith(".gz") else raw_file
    for number, raw in enumerate(f, start=1):
      try:
        lines.append(raw.decode("utf-8").rstrip("\r\n"))
      except UnicodeDecodeError as e:
        raise InputError(f"{path}:{number}: not valid UTF-8 ({e.reason} at byte "
                         f"{e.start} of the line).") from None
  return lines


def split_lines(text: str) -> list[str]:
  """Lines separated by "\\n" alone (a trailing "\\r" is dropped): str.splitlines()
  would also split on form feeds and Unicode separators inside a line, and the output
  would no longer line up with the input."""
  lines = text.split("\n")
  if lines and lines[-1] == "":
    lines.pop()  # The newline that ends the last line.
  return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_parallel_files(source_path: str, target_path: str) -> Pairs:
  """Aligned lines of two files; their line counts must agree."""
  source, target = read_lines(source_path), read_lines(target_path)
  if len(source) != len(target):
    raise InputError(f"Parallel files differ in length: {source_path} has {len(source)} "
                     f"lines, {target_path} has {len(target)}.")
  return source, target


def drop_empty(pairs: Pairs, name: str) -> Pairs:
  """Removes pairs with an empty (or all-space) side, and says how many."""
  kept = [(s, t) for s, t in zip(*pairs) if s.strip() and t.strip()]
  if len(kept) < len(pairs[0]):
    logging.info("%s: dropped %d of %d pairs with an empty side.", name,
                 len(pairs[0]) - len(kept), len(pairs[0]))
  return [s for s, _ in kept], [t for _, t in kept]


def _tfds_builder(name: str, cfg: DataConfig):
  """The TFDS builder of `name`, checked to have both languages (nothing downloaded)."""
  import tensorflow_datasets as tfds  # Heavy; only the TFDS sources need it.

  if name == "multi30k":
    from transformer_jax import multi30k  # Registers the builder with TFDS.
    builder = multi30k.Multi30k(data_dir=cfg.tfds_data_dir or None)
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


def _tfds_pairs(name: str, split: str, cfg: DataConfig) -> Pairs:
  import tensorflow_datasets as tfds

  builder = _tfds_builder(name, cfg)
  download_config = tfds.download.DownloadConfig(manual_dir=cfg.manual_dir or None)
  builder.download_and_prepare(download_config=download_config)
  source, target = [], []
  for example in tfds.as_numpy(builder.as_dataset(split=split)):
    source.append(example[cfg.source_lang].decode("utf-8"))
    target.append(example[cfg.target_lang].decode("utf-8"))
  return source, target


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
  splits exist and are readable; a TFDS dataset exists and has both languages."""
  if cfg.task == "text":
    for field in ("train_files", "eval_files"):
      for path in _files(getattr(cfg, field), field):
        if not _readable_file(path):
          raise InputError(f"config.data.{field}: {path} does not exist or is not a "
                           "readable file.")
  elif cfg.task == "tfds":
    _tfds_builder(cfg.tfds_name, cfg)


def load_split(cfg: DataConfig, split: str) -> Pairs:
  """Sentence pairs of `split` ('train', 'eval' or 'test') of the configured task."""
  name = f"{cfg.task}/{split}"
  if cfg.task == "numbers":
    count = cfg.num_train_examples if split == "train" else cfg.num_eval_examples
    return numbers.make_split("train" if split == "train" else "test", count,
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
