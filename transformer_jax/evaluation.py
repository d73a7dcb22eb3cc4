"""Evaluation: beam-search translation of whole test sets, BLEU, checkpoint averaging.

Two BLEU scores are reported. sacreBLEU's default (cased, detokenized, 13a) is the
one to compare across papers; its signature is printed with it. The paper's score
(Sec. 6.1, via tensor2tensor's get_ende_bleu.sh) is tokenized BLEU after Moses
tokenization and splitting hyphenated compounds ("a-b" -> "a ##AT##-##AT## b"); it
runs about 0.5-1.5 BLEU higher and is only for comparison with the paper.
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Any, Sequence

import jax
import numpy as np
import sacrebleu
from jax.experimental import multihost_utils
from sacremoses import MosesTokenizer

from transformer_jax import config as config_lib, decode, input_pipeline
from transformer_jax.model import Transformer
from transformer_jax.tokenizer import EOS_ID


def translate_ids(params: Any, model: Transformer, encoded: Sequence[Sequence[int]],
                  decode_cfg: config_lib.DecodeConfig) -> list[list[int]]:
  """Beam-search outputs (ids, without EOS) for tokenized sources, in their order.

  Sentences are sorted by length so each batch pads little; a batch is padded to its
  longest source rounded up to a multiple of 16, so decoding compiles a few times only.
  Sources longer than the position table allows are truncated, with a warning.
  """
  limit = model.config.max_len - decode_cfg.max_extra_length
  too_long = sum(len(e) > limit for e in encoded)
  if too_long:
    logging.warning("%d source sentences truncated to %d tokens (model.max_len=%d minus "
                    "decode.max_extra_length=%d).", too_long, limit, model.config.max_len,
                    decode_cfg.max_extra_length)
  order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
  outputs: list[list[int]] = [[] for _ in encoded]
  size = decode_cfg.batch_size
  for start in range(0, len(order), size):
    idx = order[start:start + size]
    rows = [np.asarray(encoded[i][:limit], np.int32) for i in idx]
    length = min(-(-max(len(r) for r in rows) // 16) * 16, limit)
    rows += [np.zeros(0, np.int32)] * (size - len(rows))
    tokens = decode.generate(
        params, input_pipeline.pad(rows, length), model=model,
        beam_size=decode_cfg.beam_size, alpha=decode_cfg.length_penalty,
        max_extra_length=decode_cfg.max_extra_length, eos_id=EOS_ID)
    if jax.process_count() > 1:  # Every process ran the same batch; gather the result.
      tokens = multihost_utils.process_allgather(tokens, tiled=True)
    for i, ids in zip(idx, decode.strip_after_eos(np.asarray(tokens), EOS_ID)):
      outputs[i] = ids
  return outputs


def translate(params: Any, model: Transformer, tok, sources: Sequence[str],
              decode_cfg: config_lib.DecodeConfig) -> list[str]:
  """Beam-search translations of `sources`, in their original order."""
  return [tok.decode(ids) for ids in
          translate_ids(params, model, tok.encode(sources), decode_cfg)]


def score_translations(hypotheses: Sequence[str], references: Sequence[str],
                       target_lang: str = "de") -> dict[str, Any]:
  """sacreBLEU (with signature), the paper's tokenized BLEU, and exact-match rate."""
  if len(hypotheses) != len(references):
    raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references.")
  bleu = sacrebleu.metrics.BLEU()
  score = bleu.corpus_score(list(hypotheses), [list(references)])
  exact = np.mean([h == r for h, r in zip(hypotheses, references)]) if references else 0.0
  return {"bleu": score.score, "signature": str(bleu.get_signature()),
          "paper_bleu": paper_bleu(hypotheses, references, target_lang),
          "exact_match": float(exact)}


@functools.lru_cache(maxsize=4)
def _moses(lang: str) -> MosesTokenizer:
  return MosesTokenizer(lang=lang)


def paper_bleu(hypotheses: Sequence[str], references: Sequence[str],
               lang: str = "de") -> float:
  """Tokenized, compound-split BLEU as tensor2tensor's get_ende_bleu.sh computes it."""
  def prepare(text):
    tokens = _moses(lang).tokenize(text, return_str=True, escape=False)
    return re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", tokens)
  return sacrebleu.corpus_bleu([prepare(h) for h in hypotheses],
                               [[prepare(r) for r in references]],
                               tokenize="none", force=True).score


def average_params(params_list: Sequence[Any]) -> Any:
  """Element-wise mean of several checkpoints' parameters (the paper averages the
  last 5 checkpoints for base, 20 for big; Sec. 6.1)."""
  if not params_list:
    raise ValueError("No checkpoints to average.")
  return jax.tree.map(lambda *xs: sum(xs) / len(xs), *params_list)
