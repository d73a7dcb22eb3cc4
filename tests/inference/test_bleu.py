"""BLEU and chrF as the papers and sacreBLEU compute them (transformer_jax/inference/bleu.py)."""

import os

import numpy as np
import pytest
import sacrebleu

from conftest import SHARED_DATA, write_lines
from transformer_jax.config import DataConfig
from transformer_jax.data import pretokenize, tasks
from transformer_jax.inference import bleu


def _fairseq_bleu4(hypotheses, references):
  """fairseq's BLEU4 (fairseq/bleu.py and clib/libbleu in Wu et al.'s fork): clipped
  n-gram matches on whitespace tokens, summed over the corpus; no smoothing; brevity
  min(1, exp(1 - reflen / predlen))."""
  stats = np.zeros((4, 2))
  reflen = predlen = 0
  for hyp, ref in zip(hypotheses, references):
    hyp, ref = hyp.split(), ref.split()
    reflen, predlen = reflen + len(ref), predlen + len(hyp)
    for n in range(1, 5):
      grams = lambda words: [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
      counts = {g: grams(hyp).count(g) for g in grams(hyp)}
      stats[n - 1] += [sum(min(c, grams(ref).count(g)) for g, c in counts.items()),
                       len(grams(hyp))]
  return 100 * min(1, np.exp(1 - reflen / predlen)) * np.exp(
      np.mean(np.log(stats[:, 0] / stats[:, 1])))


def test_lowercase_bleu_is_fairseqs_bleu4_on_multi30k_papers_tokens():
  """The Multi30k literature's score: lowercased, normalized, Moses-tokenized text (as
  Wu et al.'s data), then BLEU4 on the tokens. By hand: 7/8 unigrams, 5/7 bigrams, 3/6
  trigrams and 2/5 4-grams match, equal lengths: 100 (1/8)^(1/4) = 59.46."""
  hyp, ref = ["Ein Hund läuft schnell über die Wiese."], ["ein hund rennt schnell über die wiese ."]
  scores = bleu.score_translations(hyp, ref)
  assert scores["lowercase_bleu"] == pytest.approx(100 * 8 ** -0.25)
  tokens = lambda texts: [pretokenize.moses_lowercase(t, "de") for t in texts]
  assert _fairseq_bleu4(tokens(hyp), tokens(ref)) == pytest.approx(100 * 8 ** -0.25)
  assert scores["bleu"] < 30.0  # The headline score stays cased.
  quoted = ["Er sagt: „Guten Morgen“ & geht."]  # Normalized and escaped alike.
  assert bleu.lowercase_bleu(quoted, ['er sagt : " guten morgen " & geht .']) == pytest.approx(100)


def test_moses_lowercase_prepares_each_side_in_its_language_and_translations_are_text(
    tmp_path):
  """data.pretokenize="moses_lowercase" (Wu et al.'s preprocessing): SentencePiece learns
  lowercased Moses tokens of each side (English splits "kid's" as "kid 's", German as
  "kid ' s"), the cached training split is of those tokens, and decoding gives plain
  text back."""
  en = ["A kid's table.", "Two dogs & a cat play in the snow."] * 20
  de = ["Ein Mann hält ein Schild: „Guten Morgen“.", "Zwei Hunde spielen im Schnee."] * 20
  files = f"{write_lines(tmp_path / 'train.en', en)},{write_lines(tmp_path / 'train.de', de)}"
  raw = DataConfig(task="text", train_files=files, eval_files=files, vocab_size=60)
  cfg = DataConfig(**{**raw.__dict__, "pretokenize": "moses_lowercase"})
  task = tasks.load_task(cfg, str(tmp_path / "run"))
  tok = task.tokenizer
  assert not any(c.isupper() for piece in tok.pieces() for c in piece)
  as_text = lambda ids: "".join(tok.pieces()[i] for i in ids[:-1]).replace("▁", " ")
  assert as_text(task.train.inputs[0]).strip() == "a kid &apos;s table ."
  assert as_text(tok.encode(["A kid's table."], target=True)[0]).strip() == (
      "a kid &apos; s table .")
  assert as_text(task.train.targets[0]).strip() == (
      "ein mann hält ein schild : &quot; guten morgen &quot; .")
  assert tok.decode(task.train.targets[0]) == 'ein mann hält ein schild: "guten morgen".'
  assert task.eval_references[0] == de[0]  # BLEU scores against the text as it is.
  plain = tasks.load_task(raw, str(tmp_path / "raw"))  # Another cache directory.
  assert os.listdir(tmp_path / "run" / "tokenized") != os.listdir(tmp_path / "raw" / "tokenized")
  assert any(c.isupper() for piece in plain.tokenizer.pieces() for c in piece)


def test_bleu_lc_is_sacrebleus_lowercased_score_of_the_text():
  """A lowercased translation of a cased reference: bleu (cased) counts its nouns
  wrong, bleu_lc (sacreBLEU's -lc) counts them right."""
  ref = ["Ein Mann fährt Fahrrad auf der Straße."]
  hyp = [ref[0].lower()]
  scores = bleu.score_translations(hyp, ref)
  assert scores["bleu_lc"] == pytest.approx(100)
  assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyp, [ref]).score)
  assert scores["bleu"] < 50
  assert scores["bleu_lc"] == pytest.approx(
      sacrebleu.corpus_bleu(hyp, [ref], lowercase=True).score)


def test_paper_bleu_splits_compounds_and_scores_above_sacrebleu_on_hyphens():
  """tensor2tensor's get_ende_bleu.sh: Moses tokens, then "a-b" -> "a ##AT##-##AT## b",
  so a half-right compound earns n-grams that sacreBLEU's 13a (which keeps it whole)
  does not give."""
  hyp = ["Die Nord-Süd-Verbindung ist heute offen."]
  ref = ["Die Nord-Süd-Strecke ist heute offen."]
  scores = bleu.score_translations(hyp, ref)
  split = sacrebleu.corpus_bleu(
      ["Die Nord ##AT##-##AT## Süd ##AT##-##AT## Verbindung ist heute offen ."],
      [["Die Nord ##AT##-##AT## Süd ##AT##-##AT## Strecke ist heute offen ."]],
      tokenize="none")
  whole = sacrebleu.corpus_bleu(["Die Nord-Süd-Verbindung ist heute offen ."],
                                [["Die Nord-Süd-Strecke ist heute offen ."]], tokenize="none")
  assert scores["paper_bleu"] == pytest.approx(split.score)
  assert scores["paper_bleu"] > whole.score + 5
  assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyp, [ref]).score)
  assert scores["paper_bleu"] > scores["bleu"] + 5
  assert "tok:13a" in scores["signature"] and scores["exact_match"] == 0.0


NEWSTEST2014_DE = os.path.join(SHARED_DATA, "newstest2014", "newstest2014.de")

# tensor2tensor's get_ende_bleu.sh on each hypothesis file below against newstest2014's
# 3,003 German references: Moses tokenizer.perl -l de, then `perl -ple
# 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'`, then multi-bleu.perl ref.atat < hyp.atat. The
# scripts were mosesdecoder's of 2017 (commit 59119c004, 2016-12-23; tokenizer.perl,
# nonbreaking_prefix.de and multi-bleu.perl unchanged until February 2018), run once
# outside the repository (LGPL: not kept here), with multi-bleu's printf at %.4f
# instead of %.2f to show four decimals.
TENSOR2TENSOR_BLEU = {"words dropped": 33.1936, "words replaced": 51.0760,
                      "hyphens removed": 94.7644, "lowercased": 36.4516,
                      "other quotation marks": 97.7863}


def _degraded(references):
  """Hypothesis files made from the references, each by one rule of plain string
  arithmetic (no random numbers), so that they are the same on any machine."""
  words = [w for line in references for w in line.split()]
  def by_word(rule):
    out, at = [], 0
    for line in references:
      n = len(line.split())
      out.append(" ".join(w for w in (rule(at + j) for j in range(n)) if w))
      at += n
    return out
  return {
      "words dropped": by_word(lambda k: "" if k % 4 == 3 else words[k]),
      "words replaced": by_word(lambda k: words[(k + 7) % len(words)] if k % 5 == 2
                                else words[k]),
      "hyphens removed": [line.replace("-", "") for line in references],
      "lowercased": [line.lower() for line in references],
      "other quotation marks": [line.replace("\u201e", '"').replace("\u201c", '"')
                                for line in references],
  }


@pytest.mark.skipif(not os.path.exists(NEWSTEST2014_DE), reason="needs ../shared/data")
def test_paper_bleu_is_tensor2tensors_on_newstest2014():
  """Sec. 6.1's BLEU as tensor2tensor computed it (get_ende_bleu.sh: Moses-tokenized,
  compound-split, multi-bleu.perl) on real text: newstest2014's references against
  five degraded copies give the Moses scripts' figures within 0.01 BLEU."""
  with open(NEWSTEST2014_DE, encoding="utf-8") as f:
    references = f.read().splitlines()
  assert len(references) == 3003
  for name, hypotheses in _degraded(references).items():
    assert bleu.paper_bleu(hypotheses, references) == pytest.approx(
        TENSOR2TENSOR_BLEU[name], abs=0.01), name


# Moses' replace-unicode-punctuation.perl of April 2018 (mosesdecoder ae7aa6a9d) run once
# on these lines, outside the repository (LGPL: not kept here): every rule, a full stop
# taking spaces but not a tab, and characters it leaves alone.
REPLACE_UNICODE_PUNCTUATION = {
    "Preis，Menge、Summe：１０２３４５６７８９ Stück％ und ０.５∶１":
        'Preis,Menge,Summe:"023456789 Stück% und 0.5:"',
    "„Gut“ sagt er, ”nein” – 《Titel》 「Zitat」 〈a〉 【b】 （c）！ d？ e； f～g ━ h’s …":
        '„Gut" sagt er, "nein" – "Titel" "Zitat" <a> [b] (c)! d? e; f~g - h\'s ...',
    "Satz。   Nächster。Dritter．  Vierter．\tTab。\tEnde":
        "Satz. Nächster. Dritter. Vierter. \tTab. \tEnde",
    "‘So’ – „Ja“ « non » ｘ＝1.5": "‘So' – „Ja\" « non » ｘ＝1.5"}


def test_replace_unicode_punctuation_is_moses_script_rule_for_rule():
  for text, moses in REPLACE_UNICODE_PUNCTUATION.items():
    assert bleu.replace_unicode_punctuation(text) == moses


# get_ende_bleu.sh as tensor2tensor ships it since April 2018 (its commit fc9335c0):
# replace-unicode-punctuation.perl -l de on the translations, then as above; the Moses
# scripts of that date (ae7aa6a9d: tokenizer.perl for German and multi-bleu.perl's
# counts as in 2017), run once outside the repository, printf at %.4f.
TENSOR2TENSOR_2018_BLEU = {"words dropped": 32.2306, "words replaced": 50.1472,
                           "hyphens removed": 93.5646, "lowercased": 35.5457,
                           "other quotation marks": 97.7863, "unchanged": 98.7870}


@pytest.mark.skipif(not os.path.exists(NEWSTEST2014_DE), reason="needs ../shared/data")
def test_paper_bleu_2018_is_tensor2tensors_later_script_on_newstest2014():
  """The later script normalizes the translations alone: newstest2014's own references
  as translations lose their German closing quotes (U+201C, 329 of them) and score
  98.79, where the 2017 script (the default, paper_bleu) gives 100."""
  with open(NEWSTEST2014_DE, encoding="utf-8") as f:
    references = f.read().splitlines()
  hypotheses = {**_degraded(references), "unchanged": references}
  for name, translations in hypotheses.items():
    assert bleu.paper_bleu_2018(translations, references) == pytest.approx(
        TENSOR2TENSOR_2018_BLEU[name], abs=0.01), name
  assert bleu.paper_bleu(references, references) == pytest.approx(100)

def test_the_scores_take_hypotheses_then_references_as_sacrebleu_does():
  """References longer than the hypotheses: BLEU's brevity penalty and chrF's recall
  make every score depend on which side is which."""
  hyps = ["the cat sat on the mat", "a dog runs in the park today", "green trees grow"]
  refs = ["the cat sat on the red mat near the door", "a dog runs in the big park",
          "green trees grow tall in the spring rain"]
  scores, swapped = bleu.score_translations(hyps, refs), bleu.score_translations(refs, hyps)
  assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
  assert scores["bleu_lc"] == pytest.approx(
      sacrebleu.corpus_bleu(hyps, [refs], lowercase=True).score)
  assert scores["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
  plain = sacrebleu.corpus_bleu(hyps, [refs], tokenize="none", smooth_method="none").score
  assert scores["paper_bleu"] == pytest.approx(plain)  # Moses leaves these words as they are.
  assert scores["lowercase_bleu"] == pytest.approx(plain)
  assert scores["paper_bleu_2018"] == pytest.approx(plain)  # Nothing to normalize.
  for name in ("bleu", "bleu_lc", "chrf", "paper_bleu", "paper_bleu_2018", "lowercase_bleu"):
    assert abs(scores[name] - swapped[name]) > 1, name
