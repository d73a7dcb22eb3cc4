"""The subword vocabulary shared by source and target (Sec. 5.1): SentencePiece (the
default), or, an option for recipes of the Multi30k literature, subword-nmt's BPE, or
an imported Marian model's SentencePiece models and vocabulary.

Ids: 0 = padding (and the decoder's start symbol), 1 = end of sentence, 2 = unknown;
there is no begin-of-sentence id. Every encoded sentence ends with EOS. A run keeps its
tokenizer in WORKDIR/tokenizer.model: a SentencePiece model, or for subword-nmt and
Marian a JSON file; `load` tells them apart.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import logging
from collections import Counter
from typing import Iterable, Sequence

import numpy as np
import sentencepiece as spm
from etils import epath
from subword_nmt import apply_bpe, learn_bpe

from transformer_jax import files
from transformer_jax.config import EOS_ID, PAD_ID, UNK_ID
from transformer_jax.data.pretokenize import Pretokenizer


# What to do about a run's missing or damaged tokenizer.model (`load_or_train` is
# deterministic: the same data give the same model).
REBUILD = ("Restore it from a copy, or rebuild it from the training data: run the run's "
           "training command with --prepare_data.")


class Tokenizer:
  """A trained SentencePiece model, after the run's data.pretokenize; `encode` appends
  EOS, `decode` stops at it. Sources are encoded by default, targets with `target`."""

  def __init__(self, model_file: epath.PathLike, pretokenizer: Pretokenizer | None = None):
    self.pretokenizer = pretokenizer or Pretokenizer()
    model_file = epath.Path(model_file)
    if not model_file.exists():
      raise FileNotFoundError(f"No SentencePiece model at {model_file}. {REBUILD}")
    self.model_file = model_file
    try:
      self._sp = spm.SentencePieceProcessor(model_proto=model_file.read_bytes())
    except RuntimeError as e:  # SentencePiece's parser on a truncated or foreign file.
      raise ValueError(f"{model_file} is not a readable SentencePiece model ("
                       f"{' '.join(str(e).split())[:120]}): it is damaged or truncated. "
                       f"Move it aside, then: {REBUILD}") from None
    if (self._sp.pad_id(), self._sp.eos_id(), self._sp.unk_id()) != (PAD_ID, EOS_ID, UNK_ID):
      raise ValueError(f"{model_file}: expected pad/eos/unk ids {PAD_ID}/{EOS_ID}/{UNK_ID}, "
                       f"found {self._sp.pad_id()}/{self._sp.eos_id()}/{self._sp.unk_id()}.")

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  def pieces(self) -> list[str]:
    """Every piece, in id order."""
    return [self._sp.id_to_piece(i) for i in range(self.vocab_size)]

  def _prepared(self, texts: Sequence[str], target: bool) -> list[str]:
    return (self.pretokenizer.target if target else self.pretokenizer.source)(texts)

  def encode(self, texts: Sequence[str], target: bool = False) -> list[list[int]]:
    return [ids + [EOS_ID] for ids in self._sp.encode(self._prepared(texts, target))]

  def encode_flat(self, texts: Sequence[str], target: bool = False, num_threads: int = -1
                  ) -> tuple[np.ndarray, np.ndarray]:
    """All sentences' ids (each ending in EOS) back to back, and their lengths; on
    every core (num_threads=-1), with no Python int per token."""
    arrays = self._sp.encode(self._prepared(texts, target), out_type="numpy", add_eos=True,
                             num_threads=num_threads)
    lengths = np.fromiter(map(len, arrays), np.int32, len(arrays))
    return (np.concatenate(arrays) if arrays else np.zeros(0, np.int32)), lengths

  def decode(self, ids: Sequence[int]) -> str:
    return self.pretokenizer.detokenize(self._sp.decode(
        [i for i in _before_eos(ids) if i != PAD_ID]))


def _before_eos(ids: Sequence[int]) -> list[int]:
  """A decoded row's ids up to its first EOS."""
  ids = list(ids)
  return ids[: ids.index(EOS_ID)] if EOS_ID in ids else ids


def _flat(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
  """Rows of ids back to back, and their lengths (encode_flat's form)."""
  lengths = np.fromiter(map(len, rows), np.int32, len(rows))
  tokens = np.fromiter((i for row in rows for i in row), np.int32, int(lengths.sum()))
  return tokens, lengths


def load_or_train(model_file: epath.PathLike, sentences: Iterable[str], vocab_size: int,
                  model_type: str = "unigram") -> Tokenizer:
  """Loads `model_file`, or trains it on all of `sentences` first (the workdir keeps
  it). Training is deterministic: the same sentences in the same order give the same
  model, in any process (no sampling or shuffling inside SentencePiece)."""
  model_file = epath.Path(model_file)
  if model_file.exists():
    return Tokenizer(model_file)
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(sentences), model_writer=model, vocab_size=vocab_size,
      model_type=model_type, character_coverage=1.0, input_sentence_size=0,
      shuffle_input_sentence=False, pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID,
      bos_id=-1, hard_vocab_limit=False, minloglevel=2)
  files.write_atomic(model_file, model.getvalue())  # Never a half file under its name.
  return Tokenizer(model_file)


SUBWORD_NMT = "subword-nmt"  # The "format" of its tokenizer.model.


class SubwordNmt:
  """subword-nmt's BPE (Sennrich et al. 2016), as Wu et al. (2021)'s fairseq recipe
  used it: `subword-nmt apply-bpe -c CODES` (separator "@@", no vocabulary filter) on
  the pretokenized text, then `fairseq-preprocess --joined-dictionary` (every subword of
  the training data; unseen ones map to unknown). The same interface as `Tokenizer`."""

  def __init__(self, model_file: epath.PathLike, pretokenizer: Pretokenizer | None = None):
    self.pretokenizer = pretokenizer or Pretokenizer()
    self.model_file = epath.Path(model_file)
    model = json.loads(self.model_file.read_text())
    self.codes = model["codes"]
    self._bpe = apply_bpe.BPE(io.StringIO(self.codes))
    self._pieces = ["<pad>", "</s>", "<unk>", *model["vocabulary"]]
    self._ids = {piece: i for i, piece in enumerate(self._pieces)}

  @property
  def vocab_size(self) -> int:
    return len(self._pieces)

  def pieces(self) -> list[str]:
    return list(self._pieces)

  def segment(self, text: str) -> list[str]:
    """A pretokenized sentence's subwords (apply-bpe's output, split)."""
    return self._bpe.segment_tokens(text.split())

  def encode(self, texts: Sequence[str], target: bool = False) -> list[list[int]]:
    prepared = (self.pretokenizer.target if target else self.pretokenizer.source)(texts)
    return [[self._ids.get(piece, UNK_ID) for piece in self.segment(text)] + [EOS_ID]
            for text in prepared]

  def encode_flat(self, texts: Sequence[str], target: bool = False, num_threads: int = -1
                  ) -> tuple[np.ndarray, np.ndarray]:
    """As Tokenizer.encode_flat (in this thread)."""
    return _flat(self.encode(texts, target))

  def decode(self, ids: Sequence[int]) -> str:
    text = " ".join(self._pieces[i] for i in _before_eos(ids) if i != PAD_ID)
    text = (text + " ").replace("@@ ", "").strip()  # fairseq's --remove-bpe.
    return self.pretokenizer.detokenize(text)


def learn_subword_nmt(model_file: epath.PathLike, sources: Sequence[str],
                      targets: Sequence[str], merges: int) -> SubwordNmt:
  """Learns `merges` joint BPE merges on the pretokenized training sources and targets
  (`cat train.en train.de | subword-nmt learn-bpe -s MERGES`), and the vocabulary of the
  training split so segmented, by count (then alphabetically, as fairseq's dictionary
  orders it); writes them to `model_file`."""
  logging.info("learning %d BPE merges (subword-nmt) on %d sentences", merges,
               len(sources) + len(targets))
  codes = io.StringIO()
  with contextlib.redirect_stderr(io.StringIO()):  # Its progress bar.
    learn_bpe.learn_bpe([*sources, *targets], codes, merges)
  bpe = apply_bpe.BPE(io.StringIO(codes.getvalue()))
  counts = Counter(piece for text in (*sources, *targets)
                   for piece in bpe.segment_tokens(text.split()))
  vocabulary = [piece for piece, _ in sorted(counts.items(), key=lambda c: (-c[1], c[0]))]
  files.write_atomic(model_file, json.dumps(
      {"format": SUBWORD_NMT, "merges": merges, "codes": codes.getvalue(),
       "vocabulary": vocabulary}, ensure_ascii=False))
  return SubwordNmt(model_file)


MARIAN = "marian"  # The "format" of an imported Marian model's tokenizer.model.


class Marian:
  """A Marian model's tokenizer (Hugging Face's MarianTokenizer: `source.spm`,
  `target.spm` and one joint `vocab.json`), as `import_model` keeps it in a run's
  tokenizer.model. Sources are segmented by the source SentencePiece model, targets by
  the target one; pieces map to ids through the vocabulary (unknown pieces to <unk>).
  This project's ids are Marian's reordered so that padding, EOS and unknown come
  first (ids 0, 1, 2); `marian_ids[i]` is id i's id in the Marian model. The same
  interface as `Tokenizer`."""

  def __init__(self, model_file: epath.PathLike, pretokenizer: Pretokenizer | None = None):
    self.pretokenizer = pretokenizer or Pretokenizer()
    self.model_file = epath.Path(model_file)
    model = json.loads(self.model_file.read_text())
    self.source_spm = base64.b64decode(model["source_spm"])
    self.target_spm = base64.b64decode(model["target_spm"])
    self.marian_vocabulary = list(model["vocabulary"])  # Pieces in Marian's id order.
    self.marian_ids = marian_order(self.marian_vocabulary, *model["specials"])
    self._pieces = [self.marian_vocabulary[m] for m in self.marian_ids]
    self._ids = {piece: i for i, piece in enumerate(self._pieces)}
    self._source = spm.SentencePieceProcessor(model_proto=self.source_spm)
    self._target = spm.SentencePieceProcessor(model_proto=self.target_spm)

  @property
  def vocab_size(self) -> int:
    return len(self._pieces)

  def pieces(self) -> list[str]:
    return list(self._pieces)

  def encode(self, texts: Sequence[str], target: bool = False) -> list[list[int]]:
    prepared = (self.pretokenizer.target if target else self.pretokenizer.source)(texts)
    sp = self._target if target else self._source
    return [[self._ids.get(piece, UNK_ID) for piece in pieces] + [EOS_ID]
            for pieces in sp.encode(list(prepared), out_type=str)]

  def encode_flat(self, texts: Sequence[str], target: bool = False, num_threads: int = -1
                  ) -> tuple[np.ndarray, np.ndarray]:
    """As Tokenizer.encode_flat (in this thread)."""
    return _flat(self.encode(texts, target))

  def decode(self, ids: Sequence[int]) -> str:
    """As MarianTokenizer.decode(ids, skip_special_tokens=True)."""
    pieces = [self._pieces[i] for i in _before_eos(ids) if i not in (PAD_ID, UNK_ID)]
    text = self._target.decode_pieces(pieces).replace("\u2581", " ").strip()
    return self.pretokenizer.detokenize(text)


def marian_order(vocabulary: Sequence[str], pad: str, eos: str, unk: str) -> list[int]:
  """Marian ids in this project's order: padding, EOS and unknown first (ids 0, 1, 2,
  as config.PAD_ID, EOS_ID, UNK_ID), then the others as Marian numbers them."""
  where = {piece: i for i, piece in enumerate(vocabulary)}
  missing = [piece for piece in (pad, eos, unk) if piece not in where]
  if missing:
    raise ValueError(f"the Marian vocabulary has no {', '.join(missing)}")
  first = [where[pad], where[eos], where[unk]]
  return first + [i for i in range(len(vocabulary)) if i not in set(first)]


def write_marian(model_file: epath.PathLike, source_spm: bytes, target_spm: bytes,
                 vocabulary: Sequence[str], specials: Sequence[str]) -> Marian:
  """Keeps a Marian model's tokenizer files (`vocabulary`: its pieces in id order;
  `specials`: its padding, EOS and unknown pieces) as `model_file`."""
  files.write_atomic(model_file, json.dumps(
      {"format": MARIAN, "source_spm": base64.b64encode(source_spm).decode(),
       "target_spm": base64.b64encode(target_spm).decode(),
       "vocabulary": list(vocabulary), "specials": list(specials)}, ensure_ascii=False))
  return Marian(model_file)


Subwords = Tokenizer | SubwordNmt | Marian  # Any kind of run tokenizer: one interface.


def load(model_file: epath.PathLike, pretokenizer: Pretokenizer | None = None) -> Subwords:
  """The tokenizer a run saved in `model_file`, whichever kind it is."""
  model_file = epath.Path(model_file)
  if model_file.exists() and model_file.read_bytes()[:1] == b"{":
    kind = SubwordNmt
    try:
      if json.loads(model_file.read_text()).get("format") == MARIAN:
        kind = Marian
      return kind(model_file, pretokenizer)
    except (ValueError, KeyError, RuntimeError) as e:
      fix = REBUILD if kind is SubwordNmt else "Import the model again (import_model)."
      raise ValueError(f"{model_file} is not a readable {kind.__name__} model ({e}): it "
                       f"is damaged or truncated. Move it aside, then: {fix}") from None
  return Tokenizer(model_file, pretokenizer)
