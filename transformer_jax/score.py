r"""Score given translations: log P(target | source) under a trained model.

  python -m transformer_jax.score --workdir=/tmp/run --source=src.txt --target=hyp.txt
  python -m transformer_jax.score --workdir=/tmp/run --source=F --target=T --ctranslate2=DIR

Prints one line per pair: the log-probability of the target (its tokens and EOS) given
the source, the number of those tokens, and their mean log-probability, tab-separated.
It is the training computation without dropout (teacher forcing), as fairseq's
--score-reference, marian-scorer and sockeye-score compute it; --ctranslate2 scores with
the exported model instead. Uses the latest checkpoint, or --step (a step or best).
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from transformer_jax import cli, inference, serving
from transformer_jax.data import batching, corpora
from transformer_jax.data.tokenizer import PAD_ID
from transformer_jax.model import Transformer

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags (defined when run as a command, not on import)."""
  flags.DEFINE_string("workdir", None, "Workdir of a training run.", required=True)
  flags.DEFINE_string("source", None, "Source sentences, one per line.", required=True)
  flags.DEFINE_string("target", None, "Their translations, one per line.", required=True)
  flags.DEFINE_string("step", None, "Checkpoint step (default: the latest; best: the one "
                      "train.keep_best_by kept).")
  flags.DEFINE_string("ctranslate2", None, "Score with the CTranslate2 model exported to "
                      "this directory instead of a checkpoint.")
  flags.DEFINE_integer("batch_size", 64, "Pairs per batch.")


@functools.partial(jax.jit, static_argnames="model")
def _log_probs(params: Any, inputs: jax.Array, targets: jax.Array, *,
               model: Transformer) -> jax.Array:
  """log P(targets | inputs) per row, summed over the targets' non-pad tokens."""
  logits = model.apply({"params": params}, inputs, targets, deterministic=True)
  logp = jax.nn.log_softmax(logits.astype(jnp.float32))
  picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  return jnp.sum(jnp.where(targets != PAD_ID, picked, 0.0), axis=1)


def score_ids(params: Any, model: Transformer, sources: Sequence[Sequence[int]],
              targets: Sequence[Sequence[int]], batch_size: int = 64) -> list[float]:
  """log P(target | source) of each pair of token ids (targets end with EOS), in their
  order: length-sorted batches padded to multiples of 16, so few programs compile."""
  lengths = [max(len(s), len(t)) for s, t in zip(sources, targets)]
  order = np.argsort(lengths, kind="stable")
  scores = [0.0] * len(sources)
  for start in range(0, len(order), batch_size):
    idx = order[start:start + batch_size]
    width = min(batching.bucket_length(lengths[idx[-1]], 16), model.config.max_len)
    rows = lambda seqs: batching.pad([np.asarray(seqs[i][:width], np.int32) for i in idx]
                                     + [np.zeros(0, np.int32)] * (batch_size - len(idx)),
                                     width)
    values = np.asarray(_log_probs(params, rows(sources), rows(targets), model=model))
    for row, i in enumerate(idx):
      scores[i] = float(values[row])
  return scores


def main():
  try:
    trained = inference.load_workdir(FLAGS.workdir)
    sources, targets = corpora.read_parallel_files(FLAGS.source, FLAGS.target)
    tok = trained.tokenizer
    src_ids, tgt_ids = tok.encode(sources), tok.encode(targets)
    if FLAGS.ctranslate2:
      pieces = tok.pieces()
      as_pieces = lambda rows: [[pieces[i] for i in row[:-1]] for row in rows]  # Minus EOS.
      results = serving.ctranslate2_translator(FLAGS.ctranslate2).score_batch(
          as_pieces(src_ids), as_pieces(tgt_ids), max_batch_size=FLAGS.batch_size)
      scores = [sum(r.log_probs) for r in results]
    else:
      params, _ = inference.restore_params(trained, inference.parse_step(FLAGS.step))
      scores = score_ids(params, trained.model, src_ids, tgt_ids, FLAGS.batch_size)
  except (FileNotFoundError, RuntimeError, ValueError) as e:
    cli.fail(str(e))
  for score, ids in zip(scores, tgt_ids):
    sys.stdout.write(f"{score:.4f}\t{len(ids)}\t{score / len(ids):.4f}\n")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
