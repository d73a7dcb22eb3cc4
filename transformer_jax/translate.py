"""Translate text with a trained model, one sentence per line.

  python -m transformer_jax.translate --workdir=/tmp/numbers < input.txt > output.txt
  echo "thirty-four and seven" | python -m transformer_jax.translate --workdir=/tmp/numbers

Uses the workdir's config, tokenizer and latest checkpoint (or --step), with beam
search as configured (override with --beam_size / --length_penalty).
"""

import dataclasses
import logging
import sys

from absl import flags
from etils import epath

from transformer_jax import cli, corpora, inference

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Workdir of a training run.", required=True)
flags.DEFINE_integer("step", None, "Checkpoint step to load (default: the latest).")
flags.DEFINE_string("input", "-", "File of source sentences, one per line; - for stdin.")
flags.DEFINE_string("output", "-", "Where to write translations; - for stdout.")
flags.DEFINE_integer("beam_size", None, "Beam size (default: the run's decode.beam_size).")
flags.DEFINE_float("length_penalty", None, "alpha (default: decode.length_penalty).")
flags.DEFINE_integer("batch_size", None, "Sentences per batch (default: decode.batch_size).")


def _read_lines(path: str) -> list[str]:
  try:
    if path == "-":  # Bytes: text mode would also turn a lone "\r" into a line break.
      return corpora.split_lines(sys.stdin.buffer.read().decode("utf-8"))
    return corpora.split_lines(epath.Path(path).read_bytes().decode("utf-8"))
  except UnicodeDecodeError as e:
    cli.fail(f"--input={path}: not UTF-8 text ({e}).")
  except OSError as e:
    cli.fail(f"--input={path}: cannot read it ({e}).")


def main():
  if FLAGS.input != "-" and not epath.Path(FLAGS.input).exists():
    cli.fail(f"--input={FLAGS.input} does not exist.")
  try:
    trained = inference.load_workdir(FLAGS.workdir)
    overrides = {k: getattr(FLAGS, k) for k in ("beam_size", "length_penalty", "batch_size")
                 if getattr(FLAGS, k) is not None}
    decode_cfg = dataclasses.replace(trained.cfg.decode, **overrides)
    params, step = inference.restore_params(trained, FLAGS.step)
  except (FileNotFoundError, RuntimeError, ValueError) as e:
    cli.fail(str(e))
  lines = _read_lines(FLAGS.input)
  logging.info("translating %d lines with checkpoint step %d, beam %d", len(lines), step,
               decode_cfg.beam_size)
  # Exactly one output line per input line: empty in, empty out.
  nonempty = [i for i, line in enumerate(lines) if line.strip()]
  outputs = [""] * len(lines)
  translations = inference.translate(params, trained.model, trained.tokenizer,
                                     [lines[i] for i in nonempty], decode_cfg)
  for i, text in zip(nonempty, translations):
    outputs[i] = " ".join(text.splitlines())
  text = "\n".join(outputs) + ("\n" if outputs else "")
  if FLAGS.output == "-":
    sys.stdout.write(text)
  else:
    epath.Path(FLAGS.output).write_text(text)


if __name__ == "__main__":
  cli.run(main)
