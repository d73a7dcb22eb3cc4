"""Text as it goes into SentencePiece and comes out of it (data.pretokenize).

"" leaves the text as it is: SentencePiece reads raw text, as the paper's word pieces
do (Sec. 5.1). "moses_lowercase" prepares it as the Multi30k literature's fairseq
recipes did, Wu et al. (2021) among them: lowercased, Moses punctuation normalization,
Moses tokenization with escaped special characters ("a kid &apos;s table ."), each side
in its own language; translations are detokenized back to plain (lowercased) text.
sacremoses is the Moses scripts in Python; on Multi30k's training split it gives Wu et
al.'s published tokens on all but 8 of 58,000 sentences (docs/results.md).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, Sequence

from transformer_jax.config import DataConfig, PRETOKENIZERS


class Moses(NamedTuple):
  normalizer: Any  # sacremoses.MosesPunctNormalizer
  tokenizer: Any  # sacremoses.MosesTokenizer
  detokenizer: Any  # sacremoses.MosesDetokenizer


@functools.lru_cache(maxsize=4)
def moses(lang: str) -> Moses:
  """The Moses scripts for `lang` (sacremoses, imported only where they are used)."""
  from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer
  return Moses(MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang),
               MosesDetokenizer(lang=lang))


def moses_lowercase(text: str, lang: str) -> str:
  """Lowercased, punctuation-normalized, Moses-tokenized and escaped `text`."""
  tools = moses(lang)
  return tools.tokenizer.tokenize(tools.normalizer.normalize(text.lower()),
                                  return_str=True, escape=True).strip()


def moses_detokenize(text: str, lang: str) -> str:
  """Moses-tokenized, escaped `text` as plain text."""
  return moses(lang).detokenizer.detokenize(text.split(), unescape=True)


class Pretokenizer:
  """data.pretokenize for a language pair: `source` and `target` prepare sentences of
  each side for SentencePiece, `detokenize` turns target-side output back into text."""

  def __init__(self, name: str = "", source_lang: str = "en", target_lang: str = "de"):
    if name not in PRETOKENIZERS:
      raise ValueError(f"data.pretokenize={name!r}: expected one of {PRETOKENIZERS}.")
    self.name, self.source_lang, self.target_lang = name, source_lang, target_lang

  @classmethod
  def of(cls, cfg: DataConfig) -> Pretokenizer:
    return cls(cfg.pretokenize, cfg.source_lang, cfg.target_lang)

  def source(self, texts: Sequence[str]) -> list[str]:
    return self._prepare(texts, self.source_lang)

  def target(self, texts: Sequence[str]) -> list[str]:
    return self._prepare(texts, self.target_lang)

  def _prepare(self, texts: Sequence[str], lang: str) -> list[str]:
    if not self.name:
      return list(texts)
    return [moses_lowercase(text, lang) for text in texts]

  def detokenize(self, text: str) -> str:
    return moses_detokenize(text, self.target_lang) if self.name else text
