"""Scores for translations: sacreBLEU, chrF, the paper's tokenized BLEU, exact match.

sacreBLEU's default (cased, detokenized, 13a) is the score to compare across papers;
its signature is reported with it. The paper's score (Sec. 6.1, via tensor2tensor's
get_ende_bleu.sh of 2017) is tokenized BLEU after Moses tokenization and splitting
hyphenated compounds ("a-b" -> "a ##AT##-##AT## b"); it runs about 0.5-1.5 BLEU higher
and is only for comparison with the paper. `paper_bleu_2018` is the script as
tensor2tensor ships it since April 2018: the translations alone first go through Moses'
replace-unicode-punctuation.perl, so a German closing quote (U+201C) in a translation
no longer matches the reference's. A third, `lowercase_bleu`, follows the Multi30k
literature (fairseq-based multimodal MT papers, Wu et al. 2021 among them): both sides
lowercased, punctuation-normalized and Moses-tokenized as their data was
(data/pretokenize.py), then BLEU on those tokens, which is fairseq's BLEU4 (generate.py
--remove-bpe) and multi-bleu.perl's, so results can be set beside published Multi30k
tables; it is never the headline. `bleu_lc` is sacreBLEU with `-lc` (lowercase=True):
the detokenized score of a model trained on lowercased text, such as that recipe's.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np
import sacrebleu

from transformer_jax.config import METRICS
from transformer_jax.data import pretokenize

# The numbers `score_translations` returns (besides the signature), as runs report them.
SCORES = tuple(name for name, metric in METRICS.items() if metric.computed == "bleu")


def score_translations(hypotheses: Sequence[str], references: Sequence[str],
                       target_lang: str = "de") -> dict[str, Any]:
  """sacreBLEU (with signature), sacreBLEU -lc, chrF, the paper's (2017 and 2018
  scripts) and the lowercased tokenized BLEU, and the exact-match rate."""
  if len(hypotheses) != len(references):
    raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references.")
  hyps, refs = list(hypotheses), [list(references)]
  bleu = sacrebleu.metrics.BLEU()
  score = bleu.corpus_score(hyps, refs)
  exact = np.mean([h == r for h, r in zip(hypotheses, references)]) if references else 0.0
  return {"bleu": score.score, "signature": str(bleu.get_signature()),
          "bleu_lc": sacrebleu.metrics.BLEU(lowercase=True).corpus_score(hyps, refs).score,
          "chrf": sacrebleu.metrics.CHRF().corpus_score(hyps, refs).score,
          "paper_bleu": paper_bleu(hypotheses, references, target_lang),
          "paper_bleu_2018": paper_bleu_2018(hypotheses, references, target_lang),
          "lowercase_bleu": lowercase_bleu(hypotheses, references, target_lang),
          "exact_match": float(exact)}


def paper_bleu(hypotheses: Sequence[str], references: Sequence[str],
               lang: str = "de") -> float:
  """Tokenized, compound-split BLEU as tensor2tensor's get_ende_bleu.sh of 2017 computes
  it (the paper's: Moses tokenizer, `##AT##` compounds, multi-bleu.perl)."""
  def prepare(text):
    tokens = pretokenize.moses(lang).tokenizer.tokenize(text, return_str=True, escape=False)
    return re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", tokens)
  return sacrebleu.corpus_bleu([prepare(h) for h in hypotheses],
                               [[prepare(r) for r in references]],
                               tokenize="none", force=True).score


# Moses' replace-unicode-punctuation.perl as tensor2tensor's get_ende_bleu.sh ran it from
# April 2018 (mosesdecoder ae7aa6a9d, 2018-02-20), rule for rule; Moses maps a
# full-width 1 to 1, not to '"', since October 2019.
_UNICODE_PUNCTUATION = str.maketrans({
    "，": ",", "、": ",", "”": '"', "“": '"', "∶": ":", "：": ":", "？": "?", "《": '"',
    "》": '"', "）": ")", "！": "!", "（": "(", "；": ";", "１": '"', "」": '"', "「": '"',
    **{chr(0xFF10 + d): str(d) for d in (0, 2, 3, 4, 5, 6, 7, 8, 9)},
    "～": "~", "’": "'", "…": "...", "━": "-", "〈": "<", "〉": ">", "【": "[", "】": "]",
    "％": "%"})


def replace_unicode_punctuation(text: str) -> str:
  """Moses' replace-unicode-punctuation.perl: CJK and full-width punctuation and digits,
  curly double quotes, the right single quote and the ellipsis to ASCII; an ideographic
  or full-width full stop becomes ". " and takes the spaces (not tabs) after it."""
  return re.sub("[。．] *", ". ", text).translate(_UNICODE_PUNCTUATION)


def paper_bleu_2018(hypotheses: Sequence[str], references: Sequence[str],
                    lang: str = "de") -> float:
  """`paper_bleu` as tensor2tensor's get_ende_bleu.sh computes it since April 2018: the
  translations (not the references) through replace-unicode-punctuation.perl first."""
  return paper_bleu([replace_unicode_punctuation(h) for h in hypotheses], references, lang)

def lowercase_bleu(hypotheses: Sequence[str], references: Sequence[str],
                   lang: str = "de") -> float:
  """BLEU on lowercased, normalized, Moses-tokenized text: Multi30k papers' score."""
  prepare = lambda text: pretokenize.moses_lowercase(text, lang)
  return sacrebleu.corpus_bleu([prepare(h) for h in hypotheses],
                               [[prepare(r) for r in references]],
                               tokenize="none", force=True).score
