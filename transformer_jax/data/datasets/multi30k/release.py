"""Multi30k task 1's release, without TensorFlow: its files and their checksums, for
the dataset (this package), its TFDS builder and the launcher's bundle.

The release (github.com/multi30k/dataset, data/task1/raw) is six gzip files used here:
train (29,000 pairs), val (1,014) and test_2016_flickr (1,000), each .en.gz and .de.gz;
checksums.tsv beside this file holds their SHA-256 sums. Its other test sets are never
read.
"""

from __future__ import annotations

import hashlib
import os

from transformer_jax.config import InputError

# This project's split -> the release's file stem.
SPLITS = {"train": "train", "eval": "val", "test": "test_2016_flickr"}
CHECKSUMS = os.path.join(os.path.dirname(__file__), "checksums.tsv")


def file_names(langs: tuple[str, ...] = ("en", "de")) -> list[str]:
  """The release files of every split, in both languages."""
  return [f"{stem}.{lang}.gz" for stem in SPLITS.values() for lang in langs]


def sha256() -> dict[str, str]:
  """The SHA-256 sums of the release's files, by name."""
  with open(CHECKSUMS) as f:
    return {fields[3]: fields[2] for fields in (line.split() for line in f if line.strip())}


def verified(path: str) -> str:
  """`path`, a file of the release, after checking its SHA-256."""
  with open(path, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  expected = sha256()[os.path.basename(path)]
  if digest != expected:
    raise InputError(f"{path}: SHA-256 {digest} does not match the release's {expected}.")
  return path
