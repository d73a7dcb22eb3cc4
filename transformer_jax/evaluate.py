"""Score a trained model on a split: beam search, sacreBLEU and the paper's BLEU.

  python -m transformer_jax.evaluate --workdir=/tmp/run --split=test --average_last=5

--average_last=k averages the parameters of the last k checkpoints (the paper: 5 for
base, 20 for big); --step picks the newest checkpoint to use. Hypotheses go to
WORKDIR/translations/, scores to stdout and TensorBoard (`<split>/bleu`, ...).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from absl import flags
from etils import epath

from transformer_jax import bleu, cli, inference, summaries
from transformer_jax.data import corpora

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Workdir of a training run.", required=True)
flags.DEFINE_enum("split", "test", ["eval", "test"], "Which split of the run's data.")
flags.DEFINE_integer("average_last", 1, "Average the last k checkpoints (up to --step).")
flags.DEFINE_integer("step", None, "Newest checkpoint to use (default: the latest).")
flags.DEFINE_integer("beam_size", None, "Beam size (default: the run's decode.beam_size).")


def evaluate_checkpoints(workdir: str, split: str = "test", average_last: int = 1,
                         step: int | None = None,
                         beam_size: int | None = None) -> dict[str, Any]:
  """Translates `split` with the (averaged) checkpoints and scores it."""
  trained = inference.load_workdir(workdir)
  cfg = trained.cfg
  decode_cfg = cfg.decode if beam_size is None else dataclasses.replace(
      cfg.decode, beam_size=beam_size)
  chosen = inference.checkpoint_steps(workdir, average_last, step)
  params = inference.average_checkpoints(trained, chosen)
  sources, references = corpora.load_split(cfg.data, split)
  name = f"{split}_step{chosen[-1]}" + (f"_avg{average_last}" if average_last > 1 else "")
  scores = inference.translate_and_score(
      params, trained.model, trained.tokenizer, sources, references, decode_cfg,
      cfg.data.target_lang, epath.Path(workdir) / "translations" / f"{name}.txt")
  writer = summaries.SummaryWriter(epath.Path(workdir) / "evaluate")
  writer.write_scalars(chosen[-1], {f"{split}/{k}": scores[k] for k in bleu.SCORES})
  writer.close()
  return {**scores, "steps": chosen, "sentences": len(sources), "name": name}


def main():
  logging.getLogger().setLevel(logging.INFO)
  try:
    r = evaluate_checkpoints(FLAGS.workdir, FLAGS.split, FLAGS.average_last, FLAGS.step,
                             FLAGS.beam_size)
  except (FileNotFoundError, RuntimeError, ValueError) as e:
    cli.fail(str(e))
  print(f"{r['name']}: {r['sentences']} sentences, checkpoints {r['steps']}\n"
        f"  sacreBLEU {r['bleu']:.2f}  [{r['signature']}]\n"
        f"  paper-style tokenized, compound-split BLEU {r['paper_bleu']:.2f}\n"
        f"  Multi30k-style lowercased, tokenized BLEU {r['lowercase_bleu']:.2f}")


if __name__ == "__main__":
  cli.run(main)
