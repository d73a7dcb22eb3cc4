r"""Export a trained model for serving: a CTranslate2 model directory.

  pip install -e '.[export]'
  python -m transformer_jax.export --workdir=runs/m30k --output=runs/m30k/ct2 \
      [--step=N | --average_last=5] [--quantization=int8]

The directory (see ctranslate2.py for what it holds) is served with the run's tokenizer:

  import ctranslate2, sentencepiece
  sp = sentencepiece.SentencePieceProcessor(model_file="runs/m30k/tokenizer.model")
  translator = ctranslate2.Translator("runs/m30k/ct2")
  result = translator.translate_batch([sp.encode("A dog runs.", out_type=str)],
                                      beam_size=4, length_penalty=0.5, patience=4)
  print(sp.decode(result[0].hypotheses[0]))

Both engines compute the same log-probabilities and greedy outputs (tested). For beam
search, CTranslate2's length^a nearest the paper's ((5 + length) / 6)^0.6 is about
a = 0.5 (ctranslate2.ctranslate2_length_penalty), and patience 4 keeps it from stopping at
early short finishes: `translate --ctranslate2` sets both (docs/evaluation.md). A run
with data.pretokenize="moses_lowercase" reads and writes Moses tokens: prepare inputs
with transformer_jax.data.pretokenize.moses_lowercase and detokenize outputs with
moses_detokenize (`translate --ctranslate2` does).
"""

from __future__ import annotations

import logging

from absl import flags
from etils import epath

from transformer_jax import cli, config as config_lib
from transformer_jax.inference import ctranslate2

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import)."""
  flags.DEFINE_string("workdir", None, "Workdir of a training run.", required=True)
  flags.DEFINE_string("output", None, "Directory to write (default: WORKDIR/ctranslate2).")
  flags.DEFINE_enum("format", "ctranslate2", ["ctranslate2"], "Serving format.")
  flags.DEFINE_integer("step", None, "Newest checkpoint to use (default: the latest).")
  flags.DEFINE_integer("average_last", 1, "Average the last k checkpoints (up to --step).")
  flags.DEFINE_enum("quantization", None, ["int8", "int8_float32", "int16", "float16",
                                           "bfloat16", "int8_float16", "int8_bfloat16"],
                    "CTranslate2 weight quantization (default: float32 as trained).")


def main():
  logging.getLogger().setLevel(logging.INFO)
  output = FLAGS.output or str(epath.Path(FLAGS.workdir) / "ctranslate2")
  try:
    path = ctranslate2.export_ctranslate2(FLAGS.workdir, output, FLAGS.step,
                                          FLAGS.average_last, FLAGS.quantization)
  except (FileNotFoundError, RuntimeError, ValueError) as e:
    cli.fail(str(e))
  print(f"CTranslate2 model written to {path}")
  pretokenize = config_lib.parse(config_lib.load_workdir_config(FLAGS.workdir)).data.pretokenize
  if pretokenize:
    print(f"Its run has data.pretokenize={pretokenize!r}: prepare inputs with "
          "transformer_jax.data.pretokenize.moses_lowercase(text, lang) before SentencePiece, "
          "and detokenize outputs with moses_detokenize(text, lang).")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
