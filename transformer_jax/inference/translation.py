"""Translating whole sets with beam search (or sampling), and scoring them with BLEU.

Sentences are decoded in length-sorted batches, each split over the devices that hold
the parameters; over several processes the rows are gathered back. Training (for its
held-out BLEU), `evaluate`, `translate` and the benchmark all go through here, so every
translation is made and scored the same way.
"""

from __future__ import annotations

import logging
from typing import Any, Iterator, Sequence

import jax
import numpy as np
from etils import epath
from jax.experimental import multihost_utils

from transformer_jax import config as config_lib, files, partitioning
from transformer_jax.data import buckets
from transformer_jax.data.tokenizer import EOS_ID, Subwords
from transformer_jax.inference import bleu
from transformer_jax.model import beam_search
from transformer_jax.model.transformer import Transformer


def params_mesh(params: Any) -> jax.sharding.Mesh | None:
  """The mesh the parameters are laid out on, if they span several devices."""
  sharding = getattr(jax.tree.leaves(params)[0], "sharding", None)
  if isinstance(sharding, jax.sharding.NamedSharding) and sharding.mesh.size > 1:
    return sharding.mesh
  return None


def _row_multiple(mesh: jax.sharding.Mesh | None) -> int:
  """How many ways a decoding batch's rows are split (1 without a mesh)."""
  return partitioning.data_shards(mesh) if mesh is not None else 1


def decode_rows(decode_cfg: config_lib.DecodeConfig, width: int, row_multiple: int = 1) -> int:
  """Rows of a decoding batch of sources `width` wide: as many as fit
  decode.batch_tokens, at most decode.batch_size, rounded up to `row_multiple`."""
  rows = decode_cfg.batch_size
  if decode_cfg.batch_tokens:
    rows = min(max(decode_cfg.batch_tokens // width, 1), rows)
  return config_lib.round_up(rows, row_multiple)


def _batch_plan(encoded: Sequence[Sequence[int]], max_len: int,
                decode_cfg: config_lib.DecodeConfig, row_multiple: int = 1
                ) -> Iterator[tuple[list[int], int, int]]:
  """(sentence indices, width, rows) of each batch for beam search: length-sorted
  batches (buckets.sorted_batches) of as many sentences as fit decode.batch_tokens
  source tokens at the batch's width, at most decode.batch_size (batch_tokens 0:
  decode.batch_size sentences), rounded up to a multiple of `row_multiple` (the devices
  a batch is split over). Sources longer than the position table allows are cut."""
  return buckets.sorted_batches(
      [len(e) for e in encoded], lambda width: decode_rows(decode_cfg, width, row_multiple),
      max_width=max_len - decode_cfg.max_extra_length)


def decode_batches(encoded: Sequence[Sequence[int]], max_len: int,
                   decode_cfg: config_lib.DecodeConfig, row_multiple: int = 1
                   ) -> Iterator[tuple[list[int], np.ndarray]]:
  """(sentence indices, padded sources [rows, width]) of each batch of `_batch_plan`."""
  for idx, width, rows in _batch_plan(encoded, max_len, decode_cfg, row_multiple):
    yield idx, buckets.padded_rows(encoded, idx, width, rows)


def decode_input_shapes(encoded: Sequence[Sequence[int]], max_len: int,
                        decode_cfg: config_lib.DecodeConfig,
                        mesh: jax.sharding.Mesh | None = None) -> set[tuple[int, int]]:
  """The source shapes `translate_ids` will decode (one compiled program each) with
  parameters on `mesh`."""
  return {(rows, width) for _, width, rows in _batch_plan(encoded, max_len, decode_cfg,
                                                          _row_multiple(mesh))}


def place_sources(batch: np.ndarray, mesh: jax.sharding.Mesh | None) -> Any:
  """A batch of sources (the same on every process) with its rows split over the
  mesh's data shards, so that every device decodes its own share."""
  return batch if mesh is None else partitioning.shard_batch({"inputs": batch}, mesh)["inputs"]


def translate_ids(params: Any, model: Transformer, encoded: Sequence[Sequence[int]],
                  decode_cfg: config_lib.DecodeConfig, nbest: int = 0) -> list[Any]:
  """Beam-search outputs (ids, without EOS) for tokenized sources, in their order; with
  `nbest`, a list of the `nbest` best (ids, score) per source instead. An ensemble:
  `params` and `model` as `ensemble` returns them."""
  max_len = beam_search.max_len(model)
  limit = max_len - decode_cfg.max_extra_length
  too_long = sum(len(e) > limit for e in encoded)
  if too_long:
    logging.warning("%d source sentences truncated to %d tokens (model.max_len=%d minus "
                    "decode.max_extra_length=%d).", too_long, limit, max_len,
                    decode_cfg.max_extra_length)
  outputs: list[Any] = [[] for _ in encoded]
  mesh = params_mesh(params)
  for idx, batch in decode_batches(encoded, max_len, decode_cfg, _row_multiple(mesh)):
    result = decode_batch(params, place_sources(batch, mesh), model, decode_cfg, nbest=nbest)
    if jax.process_count() > 1:  # Rows were split over processes; gather them all.
      result = multihost_utils.process_allgather(result, tiled=True)
    if not nbest:
      for i, ids in zip(idx, beam_search.strip_after_eos(np.asarray(result), EOS_ID)):
        outputs[i] = ids
      continue
    tokens, scores = (np.asarray(x) for x in result)
    for row, i in enumerate(idx):
      outputs[i] = list(zip(beam_search.strip_after_eos(tokens[row], EOS_ID),
                            scores[row].tolist()))
  return outputs


def decode_batch(params: Any, inputs: Any, model: Transformer,
                 decode_cfg: config_lib.DecodeConfig, lower: bool = False,
                 nbest: int = 0) -> Any:
  """beam_search.generate with the run's settings: best outputs for sources [batch, width]
  (or the `nbest` best and their scores); with `lower`, its lowered program for these
  (abstract) arguments instead."""
  fn = beam_search.generate.lower if lower else beam_search.generate
  return fn(params, inputs, model=model, beam_size=decode_cfg.beam_size,
            alpha=decode_cfg.length_penalty, length_form=decode_cfg.length_penalty_form,
            max_extra_length=decode_cfg.max_extra_length,
            eos_id=EOS_ID, nbest=nbest, sample=decode_cfg.sample, seed=decode_cfg.seed,
            finish_within_beam=decode_cfg.finish_within_beam)


def translate(params: Any, model: Transformer, tok: Subwords, sources: Sequence[str],
              decode_cfg: config_lib.DecodeConfig, nbest: int = 0) -> list[Any]:
  """Beam-search translations of `sources`, in their original order; with `nbest`, the
  `nbest` best (text, score) of each."""
  outputs = translate_ids(params, model, tok.encode(sources), decode_cfg, nbest)
  if nbest:
    return [[(tok.decode(ids), score) for ids, score in best] for best in outputs]
  return [tok.decode(ids) for ids in outputs]


def translate_and_score(params: Any, model: Transformer, tok: Subwords,
                        sources: Sequence[str], references: Sequence[str],
                        decode_cfg: config_lib.DecodeConfig, target_lang: str,
                        hypotheses_file: epath.PathLike | None = None) -> dict[str, Any]:
  """Translates `sources`, scores them against `references` (see bleu.py) and, on
  process 0, writes the hypotheses to `hypotheses_file`, one per line.

  Returns the scores plus `hypotheses`.
  """
  hyps = translate(params, model, tok, sources, decode_cfg)
  scores = bleu.score_translations(hyps, references, target_lang)
  if hypotheses_file and jax.process_index() == 0:
    files.write_atomic(hypotheses_file, "".join(h + "\n" for h in hyps))
  return {**scores, "hypotheses": hyps}
