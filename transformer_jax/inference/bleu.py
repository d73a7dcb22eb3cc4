"""Scores for translations: sacreBLEU, chrF, the paper's tokenized BLEU, exact match.

sacreBLEU's default (cased, detokenized, 13a) is the score to compare across papers;
its signature is reported with it. The paper's score (Sec. 6.1, via tensor2tensor's
get_ende_bleu.sh) is tokenized BLEU after Moses tokenization and splitting hyphenated
compounds ("a-b" -> "a ##AT##-##AT## b"); it runs about 0.5-1.5 BLEU higher and is
only for comparison with the paper. A third, `lowercase_bleu`, follows the Multi30k
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


# The paper's Table 2: newstest2014 BLEU (tokenized, compound-split: `paper_bleu`) of
# its base and big models, by language pair.
PAPER_TABLE_2 = {("base", "en-de"): 27.3, ("base", "en-fr"): 38.1,
                 ("big", "en-de"): 28.4, ("big", "en-fr"): 41.8}


def paper_figure(row: str, source_lang: str, target_lang: str) -> float | None:
  """The paper's BLEU for Table 2's `row` ("base", "big") on this language pair."""
  return PAPER_TABLE_2.get((row, f"{source_lang}-{target_lang}"))


def score_translations(hypotheses: Sequence[str], references: Sequence[str],
                       target_lang: str = "de") -> dict[str, Any]:
  """sacreBLEU (with signature), sacreBLEU -lc, chrF, the paper's and the lowercased
  tokenized BLEU, and the exact-match rate."""
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
          "lowercase_bleu": lowercase_bleu(hypotheses, references, target_lang),
          "exact_match": float(exact)}


def paper_bleu(hypotheses: Sequence[str], references: Sequence[str],
               lang: str = "de") -> float:
  """Tokenized, compound-split BLEU as tensor2tensor's get_ende_bleu.sh computes it."""
  def prepare(text):
    tokens = pretokenize.moses(lang).tokenizer.tokenize(text, return_str=True, escape=False)
    return re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", tokens)
  return sacrebleu.corpus_bleu([prepare(h) for h in hypotheses],
                               [[prepare(r) for r in references]],
                               tokenize="none", force=True).score


def lowercase_bleu(hypotheses: Sequence[str], references: Sequence[str],
                   lang: str = "de") -> float:
  """BLEU on lowercased, normalized, Moses-tokenized text: Multi30k papers' score."""
  prepare = lambda text: pretokenize.moses_lowercase(text, lang)
  return sacrebleu.corpus_bleu([prepare(h) for h in hypotheses],
                               [[prepare(r) for r in references]],
                               tokenize="none", force=True).score
