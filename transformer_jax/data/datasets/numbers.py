"""data.task="numbers": English number words to German, generated (data/number_words.py),
no download: the embedded default task and the smoke tests' data."""

from __future__ import annotations

from typing import Iterable

from transformer_jax.config import DATASETS
from transformer_jax.data import number_words
from transformer_jax.data.corpora import Corpus


@DATASETS.register("numbers")
class NumberWords(Corpus):
  """data.num_train_examples training pairs, and data.num_eval_examples held-out pairs
  of numbers never seen in training: its eval and test split (one set)."""

  def identity(self) -> dict:
    return {"task": "numbers", "train": self.cfg.num_train_examples,
            "held_out": self.cfg.num_eval_examples}

  def pairs(self, split: str) -> Iterable[tuple[str, str]]:
    train = split == "train"
    count = self.cfg.num_train_examples if train else self.cfg.num_eval_examples
    return zip(*number_words.make_split("train" if train else "test", count,
                                        self.cfg.num_eval_examples))
