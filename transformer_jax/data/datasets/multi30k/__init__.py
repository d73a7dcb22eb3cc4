"""data.task="multi30k": Multi30k English-German (task 1), image captions.

A folder of the release's six plain files (`data.manual_dir`; release.py says which)
is read as text files, without TensorFlow; without one, `builder.py`, a TFDS dataset
builder, downloads them (TensorFlow). Either way each file is checked against the
release's SHA-256 sums.

Please cite Elliott et al. 2016, "Multi30K: Multilingual English-German Image
Descriptions"; the release limits use to non-commercial research and education.
"""

from __future__ import annotations

import dataclasses
import os

from transformer_jax.config import DATASETS, DataConfig, InputError
from transformer_jax.data.corpora import Corpus
from transformer_jax.data.datasets.multi30k import release
from transformer_jax.data.datasets.text import TextFiles
from transformer_jax.data.datasets.tfds import tensorflow_datasets, TfdsDataset


@DATASETS.register("multi30k")
class Multi30k(TfdsDataset):
  """Multi30k through its TFDS builder (also as data.task="tfds" with
  data.tfds_name="multi30k"), or, with data.manual_dir, its plain files read as text
  files (`of`). Splits: train, val (eval), test_2016_flickr (test)."""

  @classmethod
  def of(cls, cfg: DataConfig) -> Corpus:
    """With data.manual_dir: its plain files (train, val and test_2016_flickr, .en.gz
    and .de.gz), each checked once against the release's checksums, as task "text"
    (data.test_files, where given, stays the test split)."""
    if not cfg.manual_dir:
      return cls(cfg)
    paths = {f"{split}_files": [os.path.join(cfg.manual_dir, f"{stem}.{lang}.gz")
                                for lang in (cfg.source_lang, cfg.target_lang)]
             for split, stem in release.SPLITS.items()}
    if missing := [os.path.basename(p) for pair in paths.values() for p in pair
                   if not os.path.isfile(p)]:
      raise InputError(f"config.data.manual_dir={cfg.manual_dir!r} lacks "
                       f"{', '.join(missing)} (Multi30k task 1's raw files: train, val "
                       "and test_2016_flickr, .en.gz and .de.gz).")
    if cfg.test_files:  # The user's test set, not the release's.
      del paths["test_files"]
    return TextFiles(dataclasses.replace(cfg, task="text", manual_dir="", **{
        field: ",".join(release.verified(p) for p in pair) for field, pair in paths.items()}))

  @classmethod
  def reads_tfds(cls, cfg: DataConfig) -> bool:
    return not cfg.manual_dir

  @classmethod
  def named(cls, cfg: DataConfig) -> str:
    return "multi30k"

  @property
  def name(self) -> str:
    return "multi30k"

  def tfds_builder(self):
    """This package's builder (builder.py), which TFDS then knows as "multi30k"."""
    tensorflow_datasets(self.cfg.task)  # Or one line saying what to install.
    from transformer_jax.data.datasets.multi30k import builder
    return builder.Multi30k(data_dir=self.cfg.tfds_data_dir or None)

  def split_name(self, split: str) -> str:
    return release.SPLITS["test"] if split == "test" else f"multi30k:{split}"
