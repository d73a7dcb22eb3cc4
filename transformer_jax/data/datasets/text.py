"""data.task="text": aligned plain-text files (optionally .gz), local or remote, one
sentence a line: data.train_files, eval_files and test_files, each
'SOURCE_FILE,TARGET_FILE'."""

from __future__ import annotations

import os
from typing import Iterable

from etils import epath

from transformer_jax.config import DATASETS, DataConfig
from transformer_jax.config.fields import check
from transformer_jax.data import corpora
from transformer_jax.data.corpora import Corpus, Pairs


@DATASETS.register("text")
class TextFiles(Corpus):
  """Your own parallel files; the test split only where data.test_files names one."""

  reads_files = ("train", "eval", "test")

  @classmethod
  def check(cls, cfg: DataConfig) -> None:
    """data.train_files and eval_files are given."""
    for name in ("train_files", "eval_files"):
      check(bool(getattr(cfg, name)), f"data.{name}", getattr(cfg, name),
            "'SOURCE_FILE,TARGET_FILE' when data.task='text'")

  @classmethod
  def named(cls, cfg: DataConfig) -> str:
    return cfg.train_files

  def check_available(self) -> None:
    """The train and eval splits' files, and the test split's if given, exist and are
    readable."""
    for split in ("train", "eval", "test")[:3 if self.cfg.test_files else 2]:
      corpora.check_files(self.cfg, split)

  def identity(self) -> dict:
    """The training files' paths, sizes and modification times."""
    paths = [epath.Path(p) for p in corpora.file_pair(self.cfg, "train")]
    return {"task": "text", "files": [[os.fspath(p), p.stat().length, p.stat().mtime]
                                      for p in paths]}

  def pairs(self, split: str) -> Iterable[tuple[str, str]]:
    return corpora.iter_parallel_files(*corpora.file_pair(self.cfg, split))

  def whole(self, split: str) -> Pairs:
    return corpora.read_parallel_files(*corpora.file_pair(self.cfg, split))

  def where(self) -> str:
    return f"config.data.train_files={self.cfg.train_files!r}"

  def test_set(self) -> str | None:
    return corpora.named_test_files(self.cfg) if self.cfg.test_files else None

  def no_test_set(self) -> str:
    return "config.data.test_files is empty: the data has no test split"
