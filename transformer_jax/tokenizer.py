"""SentencePiece vocabulary shared by source and target (Sec. 5.1).

Ids: 0 = padding (and the decoder's start symbol), 1 = end of sentence, 2 = unknown;
there is no begin-of-sentence id. Every encoded sentence ends with EOS.
"""

from __future__ import annotations

import os
import tempfile
from typing import Iterable, Sequence

import sentencepiece as spm

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2


class Tokenizer:
  """A trained SentencePiece model; `encode` appends EOS, `decode` stops at it."""

  def __init__(self, model_file: str):
    if not os.path.exists(model_file):
      raise FileNotFoundError(f"No SentencePiece model at {model_file}.")
    self.model_file = model_file
    self._sp = spm.SentencePieceProcessor(model_file=model_file)
    if (self._sp.pad_id(), self._sp.eos_id(), self._sp.unk_id()) != (PAD_ID, EOS_ID, UNK_ID):
      raise ValueError(f"{model_file}: expected pad/eos/unk ids {PAD_ID}/{EOS_ID}/{UNK_ID}, "
                       f"found {self._sp.pad_id()}/{self._sp.eos_id()}/{self._sp.unk_id()}.")

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  def encode(self, texts: Sequence[str]) -> list[list[int]]:
    return [ids + [EOS_ID] for ids in self._sp.encode(list(texts))]

  def decode(self, ids: Sequence[int]) -> str:
    ids = list(ids)
    if EOS_ID in ids:
      ids = ids[: ids.index(EOS_ID)]
    return self._sp.decode([i for i in ids if i != PAD_ID])


def load_or_train(model_file: str, sentences: Iterable[str], vocab_size: int,
                  model_type: str = "unigram", max_sentences: int = 2_000_000) -> Tokenizer:
  """Loads `model_file`, or trains it on `sentences` first (the workdir keeps it)."""
  if os.path.exists(model_file):
    return Tokenizer(model_file)
  os.makedirs(os.path.dirname(model_file) or ".", exist_ok=True)
  with tempfile.TemporaryDirectory(dir=os.path.dirname(model_file) or ".") as tmp:
    prefix = os.path.join(tmp, "spm")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_prefix=prefix, vocab_size=vocab_size,
        model_type=model_type, character_coverage=1.0, input_sentence_size=max_sentences,
        shuffle_input_sentence=True, pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID,
        bos_id=-1, hard_vocab_limit=False, minloglevel=2)
    os.replace(prefix + ".model", model_file)  # Atomic: a crash leaves no half file.
  return Tokenizer(model_file)
