r"""Export a trained run: a CTranslate2 model directory for serving, or a Hugging Face
MarianMT folder for sharing (transformers loads it with no code of ours).

  pip install -e '.[export]'
  python -m transformer_jax.export --workdir=runs/m30k --output=runs/m30k/ct2 \
      [--step=N | --step=best | --average_last=5] [--quantization=int8]
  python -m transformer_jax.export --format=huggingface --workdir=runs/m30k \
      --output=runs/m30k/hf [--step=... | --average_last=5]

The CTranslate2 directory (see inference/ctranslate2.py for what it holds) is served
with the run's tokenizer:

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

The Hugging Face folder holds the weights (safetensors), config.json,
generation_config.json, the tokenizer's files and a model card (docs/interop.md):

  from transformers import MarianMTModel, MarianTokenizer
  model, tokenizer = (c.from_pretrained("runs/m30k/hf") for c in (MarianMTModel, MarianTokenizer))
  print(tokenizer.batch_decode(model.generate(**tokenizer(["A dog runs."], return_tensors="pt")),
                               skip_special_tokens=True))
"""

from __future__ import annotations

import logging
import shlex
import sys

from absl import flags
from etils import epath

from transformer_jax import cli, config as config_lib
from transformer_jax.inference import ctranslate2, huggingface, restore

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import)."""
  flags.DEFINE_string("workdir", None, "Workdir of a training run.", required=True)
  flags.DEFINE_string("output", None, "Directory to write (default: WORKDIR/ctranslate2).")
  flags.DEFINE_enum("format", "ctranslate2", ["ctranslate2", "huggingface"],
                    "ctranslate2: a CTranslate2 model for serving; huggingface: a MarianMT "
                    "folder that transformers loads (default --output: WORKDIR/FORMAT).")
  flags.DEFINE_string("step", None, "Newest checkpoint to use (default: the latest), or "
                      "best (train.keep_best_by's).")
  flags.DEFINE_integer("average_last", 1, "Average the last k checkpoints (up to --step).")
  flags.DEFINE_enum("quantization", None, ["int8", "int8_float32", "int16", "float16",
                                           "bfloat16", "int8_float16", "int8_bfloat16"],
                    "CTranslate2 weight quantization (default: float32 as trained).")


def main():
  logging.getLogger().setLevel(logging.INFO)
  output = FLAGS.output or str(epath.Path(FLAGS.workdir) / FLAGS.format)
  try:
    step = restore.parse_step(FLAGS.step)
    if FLAGS.format == "huggingface":
      if FLAGS.quantization:
        raise ValueError("--quantization is CTranslate2's: the huggingface export is float32.")
      path = huggingface.export_huggingface(FLAGS.workdir, output, step, FLAGS.average_last,
                                            command=shlex.join(["python", "-m",
                                                                "transformer_jax.export",
                                                                *sys.argv[1:]]))
      print(f"MarianMT model written to {path} (transformers: "
            f"MarianMTModel.from_pretrained({path!r}))")
      return
    path = ctranslate2.export_ctranslate2(FLAGS.workdir, output, step,
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
  cli.run(main, stopped="before the export was complete: --output was not written (a "
          "folder already there is kept as it was).")
