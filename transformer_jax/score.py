r"""Score given translations: log P(target | source) under a trained model.

  python -m transformer_jax.score --workdir=/tmp/run --source=src.txt --target=hyp.txt
  python -m transformer_jax.score --workdir=/tmp/run --source=F --target=T --ctranslate2=DIR

Prints one line per pair: the log-probability of the target (its tokens and EOS) given
the source, the number of those tokens, and their mean log-probability, tab-separated.
It is the training computation without dropout (teacher forcing), as fairseq's
--score-reference, marian-scorer and sockeye-score compute it (inference/scoring.py);
--ctranslate2 scores with the exported model instead. Uses the latest checkpoint, or
--step (a step or best).
"""

from __future__ import annotations

import sys

from absl import flags

from transformer_jax import cli
from transformer_jax.data import corpora
from transformer_jax.inference import ctranslate2, restore, scoring

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


def main():
  try:
    trained = restore.load_workdir(FLAGS.workdir)
    sources, targets = corpora.read_parallel_files(FLAGS.source, FLAGS.target)
    tok = trained.tokenizer
    src_ids, tgt_ids = tok.encode(sources), tok.encode(targets, target=True)
    if FLAGS.ctranslate2:
      pieces = tok.pieces()
      as_pieces = lambda rows: [[pieces[i] for i in row[:-1]] for row in rows]  # Minus EOS.
      results = ctranslate2.ctranslate2_translator(FLAGS.ctranslate2).score_batch(
          as_pieces(src_ids), as_pieces(tgt_ids), max_batch_size=FLAGS.batch_size)
      scores = [sum(r.log_probs) for r in results]
    else:
      params, _, _ = restore.chosen_params(trained, 1, restore.parse_step(FLAGS.step),
                                           exact=True)
      scores = scoring.score_ids(params, trained.model, src_ids, tgt_ids, FLAGS.batch_size)
  except (FileNotFoundError, RuntimeError, ValueError) as e:
    cli.fail(str(e))
  for score, ids in zip(scores, tgt_ids):
    sys.stdout.write(f"{score:.4f}\t{len(ids)}\t{score / len(ids):.4f}\n")


if __name__ == "__main__":
  define_flags()
  cli.run(main, stopped="before the last line was scored: the scores written so far are "
          "on the output, one line each.")
