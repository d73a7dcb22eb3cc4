"""Multi30k English-German (task 1) as a TFDS dataset builder (the release:
release.py). With network access it downloads the release; offline, give it the
six files as a manual directory (the commands read such a folder without TFDS). Both
paths check the SHA-256 sums in checksums.tsv beside this file, which TFDS reads too.
Splits: train, validation, test (test_2016_flickr).
"""

from __future__ import annotations

import gzip
import os

import tensorflow_datasets as tfds

from transformer_jax.data.datasets.multi30k import release

_URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw/"
_SPLITS = {"train": release.SPLITS["train"], "validation": release.SPLITS["eval"],
           "test": release.SPLITS["test"]}  # TFDS's split -> the release's file stem.


class Multi30k(tfds.core.GeneratorBasedBuilder):
  """Multi30k task 1: English-German image-caption translation."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Task 1 raw text: train, val, test_2016_flickr."}
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      "Offline: put train.{en,de}.gz, val.{en,de}.gz and test_2016_flickr.{en,de}.gz from "
      "github.com/multi30k/dataset/tree/master/data/task1/raw in the manual directory.")

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self, description="Multi30k task 1 English-German image captions.",
        features=tfds.features.Translation(languages=("en", "de")),
        supervised_keys=("en", "de"),
        homepage="https://github.com/multi30k/dataset",
        citation="Elliott et al. 2016, Multi30K: Multilingual English-German Image "
                 "Descriptions, Proceedings of the 5th Workshop on Vision and Language.")

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    names = release.file_names()
    if _has_manual_files(dl_manager, names):
      paths = {name: release.verified(os.path.join(dl_manager.manual_dir, name))
               for name in names}
    else:  # Checked against checksums.tsv by TFDS.
      paths = dl_manager.download({name: _URL + name for name in names})
    return {split: self._generate_examples(paths[f"{stem}.en.gz"], paths[f"{stem}.de.gz"])
            for split, stem in _SPLITS.items()}

  def _generate_examples(self, en_path, de_path):
    with gzip.open(en_path, "rt", encoding="utf-8") as en, \
        gzip.open(de_path, "rt", encoding="utf-8") as de:
      en_lines, de_lines = en.read().splitlines(), de.read().splitlines()
    if len(en_lines) != len(de_lines):
      raise ValueError(f"{en_path} has {len(en_lines)} lines but {de_path} has "
                       f"{len(de_lines)}.")
    for i, (e, d) in enumerate(zip(en_lines, de_lines)):
      yield i, {"en": e, "de": d}


def _has_manual_files(dl_manager, names) -> bool:
  try:
    manual = dl_manager.manual_dir
  except (AssertionError, ValueError):  # TFDS's way of saying "no manual dir".
    return False
  missing = [n for n in names if not os.path.exists(os.path.join(manual, n))]
  if missing:
    raise FileNotFoundError(f"Manual directory {manual} lacks {', '.join(missing)}.")
  return True
