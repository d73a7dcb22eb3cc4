"""Using a trained model: restore its parameters (no optimizer), average checkpoints,
translate whole sets with beam search, and score them.

Training (for its held-out BLEU), `evaluate`, `translate` and the benchmark all go
through here, so every translation is made and scored the same way.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Iterator, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from transformer_jax import bleu, checkpoint, config as config_lib, decode, files
from transformer_jax import partitioning
from transformer_jax.data import batching
from transformer_jax.data.tokenizer import EOS_ID, Tokenizer
from transformer_jax.model import Transformer


@dataclasses.dataclass(frozen=True)
class TrainedModel:
  """What a training run's workdir holds, apart from the weights."""

  workdir: str
  cfg: config_lib.Config  # With the tokenizer's vocabulary filled in.
  tokenizer: Tokenizer
  model: Transformer


def load_workdir(workdir: str) -> TrainedModel:
  """The config and tokenizer a run saved in `workdir`, and its model."""
  cfg = config_lib.parse(config_lib.load_workdir_config(workdir))
  tok = Tokenizer(epath.Path(workdir) / "tokenizer.model")
  cfg = config_lib.with_vocab(cfg, tok.vocab_size)
  return TrainedModel(workdir, cfg, tok, Transformer(cfg.model))


def load_ensemble(workdirs: Sequence[str]) -> list[TrainedModel]:
  """The runs of an ensemble (one workdir: a single model); they must share a
  tokenizer, and decode with the first run's settings."""
  runs = [load_workdir(w) for w in workdirs]
  first = (epath.Path(runs[0].workdir) / "tokenizer.model").read_bytes()
  for run in runs[1:]:
    if (epath.Path(run.workdir) / "tokenizer.model").read_bytes() != first:
      raise ValueError(f"{run.workdir} has another tokenizer than {runs[0].workdir}: "
                       "an ensemble's models must share one (the same tokenizer.model).")
  return runs


def ensemble(runs: Sequence[TrainedModel], params: Sequence[Any]) -> tuple[Any, Any]:
  """(params, model) for decoding: as they are for one run, tuples for several."""
  if len(runs) == 1:
    return params[0], runs[0].model
  return tuple(params), tuple(run.model for run in runs)


def init_params(model: Transformer, rng: jax.Array, length: int = 8) -> Any:
  """Freshly initialised parameters, boxed with their logical axis names."""
  dummy = jnp.ones((1, length), jnp.int32)
  return model.init(rng, dummy, dummy)["params"]


def inference_mesh(cfg: config_lib.Config) -> jax.sharding.Mesh:
  """The run's mesh where this host has several devices; else one device."""
  return partitioning.make_mesh(cfg.train.mesh_shape if jax.device_count() > 1
                                else (1,) * len(config_lib.MESH_AXES))


def parse_step(value: str | None) -> int | str | None:
  """A --step flag: a checkpoint step, "best" (train.keep_best_by's) or None (latest)."""
  if value is None or value == "best":
    return value
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"--step={value!r}: expected a checkpoint step or 'best'.") from None


def restore_params(trained: TrainedModel, step: int | str | None = None
                   ) -> tuple[Any, int]:
  """Parameters of checkpoint `step` (default: the latest; "best": the one that
  train.keep_best_by kept in WORKDIR/best/), and that step.

  Only the `params` subtree is read from disk: no optimizer is built and Adam's
  moments (twice the parameters' size) are never loaded.
  """
  mesh = inference_mesh(trained.cfg)
  boxed = jax.eval_shape(lambda rng: init_params(trained.model, rng), jax.random.key(0))
  abstract = checkpoint.abstract_with_shardings(
      nn.meta.unbox(boxed),
      partitioning.logical_shardings(boxed, mesh, trained.cfg.train.logical_axis_rules))
  if step == "best":
    if not trained.cfg.train.keep_best_by:
      raise FileNotFoundError(
          f"--step=best: {trained.workdir} kept no best checkpoint: its config has no "
          "train.keep_best_by (set it, e.g. --config.train.keep_best_by=eval/bleu, when "
          "training; --step=N picks a checkpoint).")
    mngr, step = checkpoint.best_manager(trained.workdir, read_only=True), None
  else:
    mngr = checkpoint.manager(trained.workdir, 1, read_only=True)
  step = checkpoint.existing_step(mngr, step)
  item = {"params": abstract}  # The train state's other entries stay on disk.
  args = ocp.args.PyTreeRestore(
      item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item),
      partial_restore=True)
  return checkpoint.restore(mngr, step, args)["params"], step


def checkpoint_steps(workdir: str, average_last: int = 1,
                     step: int | None = None) -> list[int]:
  """The last `average_last` checkpoint steps of `workdir` up to `step` (default: all)."""
  if average_last < 1:
    raise ValueError(f"--average_last={average_last}: expected 1 or more checkpoints.")
  steps = sorted(checkpoint.manager(workdir, 1, read_only=True).all_steps())
  if step is not None:
    steps = [s for s in steps if s <= step]
  upto = f" up to step {step}" if step is not None else ""
  if not steps:
    raise FileNotFoundError(f"No checkpoint in {workdir}/checkpoints{upto}.")
  if len(steps) < average_last:
    raise ValueError(f"--average_last={average_last}: {workdir} has only {len(steps)} "
                     f"checkpoints{upto}: {steps}. A run keeps its last "
                     "train.keep_checkpoints, one every train.checkpoint_every_steps: "
                     f"train with --config.train.keep_checkpoints={average_last} or more "
                     "to average that many.")
  return steps[-average_last:]


def average_checkpoints(trained: TrainedModel, steps: Sequence[int]) -> Any:
  """Element-wise mean of the parameters of checkpoints `steps` (the paper averages
  the last 5 for base, 20 for big; Sec. 6.1), as a running mean: two parameter copies
  in memory however many checkpoints are averaged."""
  if not steps:
    raise ValueError("No checkpoints to average.")
  return running_mean(restore_params(trained, step)[0] for step in steps)


def running_mean(trees: Iterator[Any]) -> Any:
  """Element-wise mean of the trees, holding two of them at a time."""
  mean = None
  for n, tree in enumerate(trees, start=1):
    mean = tree if mean is None else jax.tree.map(lambda m, x: m + (x - m) / n, mean, tree)
  return mean


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
  return -(-rows // row_multiple) * row_multiple


def _batch_plan(encoded: Sequence[Sequence[int]], max_len: int,
                decode_cfg: config_lib.DecodeConfig, row_multiple: int = 1
                ) -> Iterator[tuple[list[int], int, int]]:
  """(sentence indices, width, rows) of each batch for beam search.

  Sentences are sorted by length and taken in that order, each batch padded to the
  nearest of at most 8 widths (multiples of 16 chosen for these sentences to waste the
  least padding), so decoding compiles at most 8 programs and every batch but the last
  is full: as many sentences as fit decode.batch_tokens source tokens at the batch's
  width, at most decode.batch_size (batch_tokens 0: decode.batch_size sentences),
  rounded up to a multiple of `row_multiple` (the devices it is split over).
  """
  limit = max_len - decode_cfg.max_extra_length
  lengths = np.minimum([len(e) for e in encoded], limit)
  if not len(encoded):
    return
  widths = np.unique(np.minimum(batching.length_buckets(lengths, 8, 16), limit))
  order = np.argsort(lengths, kind="stable")
  sorted_widths = widths[np.searchsorted(widths, lengths[order])].tolist()
  order = order.tolist()

  def rows_for(width: int) -> int:
    return decode_rows(decode_cfg, width, row_multiple)

  start = 0
  while start < len(order):
    end = start + 1  # Longer sentences join while the batch at their width has room.
    while end < len(order) and end - start < rows_for(sorted_widths[end]):
      end += 1
    width = sorted_widths[end - 1]
    yield order[start:end], width, rows_for(width)
    start = end


def _decode_batches(encoded: Sequence[Sequence[int]], max_len: int,
                    decode_cfg: config_lib.DecodeConfig, row_multiple: int = 1
                    ) -> Iterator[tuple[list[int], np.ndarray]]:
  """(sentence indices, padded sources [rows, width]) of each batch of `_batch_plan`.
  Sources longer than the position table allows are truncated."""
  limit = max_len - decode_cfg.max_extra_length
  for idx, width, rows in _batch_plan(encoded, max_len, decode_cfg, row_multiple):
    sources = [np.asarray(encoded[i][:limit], np.int32) for i in idx]
    sources += [np.zeros(0, np.int32)] * (rows - len(sources))
    yield idx, batching.pad(sources, width)


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
  max_len = decode.max_len(model)
  limit = max_len - decode_cfg.max_extra_length
  too_long = sum(len(e) > limit for e in encoded)
  if too_long:
    logging.warning("%d source sentences truncated to %d tokens (model.max_len=%d minus "
                    "decode.max_extra_length=%d).", too_long, limit, max_len,
                    decode_cfg.max_extra_length)
  outputs: list[Any] = [[] for _ in encoded]
  mesh = params_mesh(params)
  for idx, batch in _decode_batches(encoded, max_len, decode_cfg, _row_multiple(mesh)):
    result = decode_batch(params, place_sources(batch, mesh), model, decode_cfg, nbest=nbest)
    if jax.process_count() > 1:  # Rows were split over processes; gather them all.
      result = multihost_utils.process_allgather(result, tiled=True)
    if not nbest:
      for i, ids in zip(idx, decode.strip_after_eos(np.asarray(result), EOS_ID)):
        outputs[i] = ids
      continue
    tokens, scores = (np.asarray(x) for x in result)
    for row, i in enumerate(idx):
      outputs[i] = list(zip(decode.strip_after_eos(tokens[row], EOS_ID),
                            scores[row].tolist()))
  return outputs


def decode_batch(params: Any, inputs: Any, model: Transformer,
                decode_cfg: config_lib.DecodeConfig, lower: bool = False,
                nbest: int = 0) -> Any:
  """decode.generate with the run's settings: best outputs for sources [batch, width]
  (or the `nbest` best and their scores); with `lower`, its lowered program for these
  (abstract) arguments instead."""
  fn = decode.generate.lower if lower else decode.generate
  return fn(params, inputs, model=model, beam_size=decode_cfg.beam_size,
            alpha=decode_cfg.length_penalty, max_extra_length=decode_cfg.max_extra_length,
            eos_id=EOS_ID, nbest=nbest, sample=decode_cfg.sample, seed=decode_cfg.seed)


def translate(params: Any, model: Transformer, tok: Tokenizer, sources: Sequence[str],
              decode_cfg: config_lib.DecodeConfig, nbest: int = 0) -> list[Any]:
  """Beam-search translations of `sources`, in their original order; with `nbest`, the
  `nbest` best (text, score) of each."""
  outputs = translate_ids(params, model, tok.encode(sources), decode_cfg, nbest)
  if nbest:
    return [[(tok.decode(ids), score) for ids, score in best] for best in outputs]
  return [tok.decode(ids) for ids in outputs]


def translate_and_score(params: Any, model: Transformer, tok: Tokenizer,
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
