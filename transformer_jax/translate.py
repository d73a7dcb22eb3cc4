"""Translate text with a trained model, one sentence per line.

  python -m transformer_jax.translate --workdir=/tmp/numbers < input.txt > output.txt
  echo "thirty-four and seven" | python -m transformer_jax.translate --workdir=/tmp/numbers
  python -m transformer_jax.translate --workdir=/tmp/numbers     # type lines; Ctrl-D ends

Uses the workdir's config, tokenizer and latest checkpoint (or --step), with beam
search as configured (override with --beam_size / --length_penalty). Several
workdirs (--workdir=A,B) translate as an ensemble: each step averages the models'
log-probabilities. --sample=topk:K|topp:P|temperature:T draws each token instead of
searching (for back-translation); --seed=S makes the draws reproducible. With
--ctranslate2=DIR, the model exported there (python -m transformer_jax.export) is used
instead, through CTranslate2 (pip install -e '.[export]'): same tokenizer and settings,
its own beam search set to decode as ours (docs/evaluation.md).

Streams: every line that has arrived is translated as soon as the previous batch is
done, so a line typed at a terminal is answered at once and piped input is translated
in length-sorted batches (up to 4 x --batch_size lines) without waiting for its end.
With --output=FILE, the translations are written to a temporary file beside it and
renamed to FILE at the end: a stopped command leaves FILE as it was (and says so), and
an --output that is the --input file is refused. Lines are split on "\\n" only. The
output has exactly one line per input line (an empty line gives an empty line;
over-long ones are truncated, said on stderr); with
--nbest=N, N lines per non-empty input line instead, Moses-style:
`LINE ||| TRANSLATION ||| SCORE` (LINE counts from 0; SCORE is log P / length penalty).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import uuid
from typing import Any, Iterator

from absl import flags
from etils import epath

from transformer_jax import cli, files
from transformer_jax.data import corpora
from transformer_jax.inference import ctranslate2, restore, translation

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import)."""
  flags.DEFINE_string("workdir", None, "Workdir of a training run; several, "
                      "comma-separated, translate as an ensemble (they must share a "
                      "tokenizer).", required=True)
  flags.DEFINE_string("step", None, "Checkpoint step to load (default: the latest; best: "
                      "the one train.keep_best_by kept).")
  flags.DEFINE_string("input", "-", "File of source sentences, one per line; - for stdin.")
  flags.DEFINE_string("output", "-", "Where to write translations; - for stdout.")
  flags.DEFINE_integer("beam_size", None, "Beam size (default: the run's "
                       "decode.beam_size).")
  flags.DEFINE_float("length_penalty", None, "alpha (default: decode.length_penalty).")
  flags.DEFINE_integer("batch_size", None, "At most this many sentences per batch "
                       "(default: decode.batch_size; decode.batch_tokens sets the source "
                       "tokens).")
  flags.DEFINE_integer("nbest", 0, "Print the N best translations of each line, with "
                       "scores (N <= beam size); 0: the best one only.")
  flags.DEFINE_string("sample", None, "Sample instead of beam search (back-translation): "
                      "topk:K, topp:P or temperature:T.")
  flags.DEFINE_integer("seed", None, "Seed of --sample: the same seed and input, the same "
                       "samples (default: decode.seed).")
  flags.DEFINE_string("ctranslate2", None, "Translate with the CTranslate2 model "
                      "exported to this directory (python -m transformer_jax.export) "
                      "instead of a checkpoint.")


def _input_chunks(max_lines: int) -> Iterator[list[bytes]]:
  if FLAGS.input == "-":
    yield from corpora.line_chunks(sys.stdin.fileno(), max_lines)
    return
  lines = epath.Path(FLAGS.input).read_bytes().split(b"\n")  # Local or gs://.
  if lines and not lines[-1]:
    lines.pop()  # The "\n" that ends the last line.
  for start in range(0, len(lines), max_lines):
    yield lines[start:start + max_lines]


def _text_of_line(raw: bytes, number: int, path: str) -> str:
  """Input line `number` as text, or exit naming the line if it is not UTF-8."""
  try:
    return corpora.decode_line(raw)
  except UnicodeDecodeError as e:
    cli.fail(f"--input={path}, line {number}: not UTF-8 text ({e.reason} at byte "
             f"{e.start}).")


def main():
  if FLAGS.input != "-" and not epath.Path(FLAGS.input).exists():
    cli.fail(f"--input={FLAGS.input} does not exist.")
  if FLAGS.output != "-" and FLAGS.input != "-" and _same_file(FLAGS.input, FLAGS.output):
    cli.fail(f"--output={FLAGS.output} is the input file --input={FLAGS.input}: writing "
             "it would destroy the sentences being translated. Choose another --output.")
  try:
    runs = restore.load_ensemble(FLAGS.workdir.split(","))
    trained = runs[0]  # Its tokenizer and decoding settings.
    overrides = {k: getattr(FLAGS, k) for k in ("beam_size", "length_penalty", "batch_size",
                                                "sample", "seed")
                 if getattr(FLAGS, k) is not None}
    decode_cfg = dataclasses.replace(trained.cfg.decode, **overrides)
    if FLAGS.nbest and decode_cfg.sample:
      raise ValueError("--nbest with --sample: sampling draws one translation per line.")
    if not 0 <= FLAGS.nbest <= decode_cfg.beam_size:
      raise ValueError(f"--nbest={FLAGS.nbest}: expected 0 to the beam size "
                       f"({decode_cfg.beam_size}).")
    if FLAGS.ctranslate2:
      if len(runs) > 1:
        raise ValueError("--ctranslate2 translates with one exported model, not an "
                         "ensemble of --workdir runs.")
      translator = ctranslate2.ctranslate2_translator(FLAGS.ctranslate2)
      translate = lambda lines: ctranslate2.translate_ctranslate2(
          translator, trained.tokenizer, lines, decode_cfg, FLAGS.nbest)
      logging.info("translating with the CTranslate2 model in %s, %s", FLAGS.ctranslate2,
                   decode_cfg.describe())
    else:
      restored = [restore.chosen_params(run, 1, restore.parse_step(FLAGS.step), exact=True)
                  for run in runs]
      params, model = restore.ensemble(runs, [p for p, _, _ in restored])
      translate = lambda lines: translation.translate(
          params, model, trained.tokenizer, lines, decode_cfg, FLAGS.nbest)
      logging.info("translating with checkpoint step(s) %s, %s",
                   [steps[0] for _, steps, _ in restored], decode_cfg.describe())
  except (FileNotFoundError, RuntimeError, ValueError) as e:
    cli.fail(str(e))
  with _output(FLAGS.output) as out:
    _translate_lines(translate, decode_cfg, out)


def _same_file(a: str, b: str) -> bool:
  """Whether two local paths name one file (through links, `..` or another spelling)."""
  if files.is_remote(a) or files.is_remote(b):
    return a == b
  if os.path.exists(a) and os.path.exists(b):
    return os.path.samefile(a, b)
  return os.path.realpath(a) == os.path.realpath(b)


@contextlib.contextmanager
def _output(path: str) -> Iterator[Any]:
  """stdout (streaming), or a file written to be true: the translations go to a
  temporary file beside `path`, renamed to it only once every line is done; a stop
  (Ctrl-C, SIGTERM, an error) leaves whatever `path` held untouched and says so."""
  if path == "-":
    yield sys.stdout
    return
  target = epath.Path(path)
  tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.tmp")
  try:
    with tmp.open("w") as out:
      yield out
    files.put_in_place(tmp, target)
  except cli.Stopped as e:  # cli.run says it, once the temporary file is gone.
    e.note = f"before the last line was translated: --output={path} {_kept(target)}."
    raise
  except OSError as e:
    if not files.out_of_space(e):
      raise
    cli.fail(f"no space left on the device of {path} for the translations: "
             f"--output={path} {_kept(target)}. Free space, then run the same command.",
             cli.EXIT_DISK_FULL)
  finally:
    if tmp.exists():
      tmp.unlink()


def _kept(target: epath.Path) -> str:
  return "kept as it was" if target.exists() else "not written"


def _translate_lines(translate, decode_cfg, out) -> None:
  """Translates the input's lines chunk by chunk, writing each chunk's lines to `out`."""
  number = 0
  for chunk in _input_chunks(4 * decode_cfg.batch_size):
    lines = [_text_of_line(raw, number + i + 1, FLAGS.input) for i, raw in enumerate(chunk)]
    nonempty = [i for i, line in enumerate(lines) if line.strip()]
    results = translate([lines[i] for i in nonempty])
    if FLAGS.nbest:
      out.write("".join(f"{number + i} ||| {' '.join(text.split())} ||| {score:.4f}\n"
                        for i, best in zip(nonempty, results) for text, score in best))
    else:
      outputs = [""] * len(lines)  # Exactly one line per input line.
      for i, text in zip(nonempty, results):
        outputs[i] = " ".join(text.splitlines())
      out.write("".join(o + "\n" for o in outputs))
    out.flush()
    number += len(lines)


if __name__ == "__main__":
  define_flags()
  cli.run(main, stopped="before the last line was translated: the translations written "
          "so far are on the output, one line each.")
