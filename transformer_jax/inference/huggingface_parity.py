r"""Does the MarianMT export of a run translate as the run does, and where not, why?

  python -m transformer_jax.inference.huggingface_parity --workdir=/tmp/numbers \
      --huggingface=/tmp/numbers/huggingface [--split=eval]

Translates the split four ways and prints each one's sacreBLEU and how many outputs
agree: this project's search with the run's settings, and transformers with the
export's generation_config.json (what `evaluate` and `evaluate --huggingface` score);
then the two searches set alike: this project's with transformers' length penalty form
(|Y|^a, decode.length_penalty_form="fairseq") and finishing rule
(decode.finish_within_beam), transformers' with this project's per-source length
limit. Where the first pair differs and the second does not, the search settings are
the only cause; what differs then is counted by whether it reached the length limit,
where transformers' forced EOS costs nothing (log-probability 0) and this project's
its log-probability (docs/interop.md).
"""

import dataclasses
import json
import os

from absl import flags

from transformer_jax import cli
from transformer_jax.data import corpora
from transformer_jax.inference import bleu, huggingface, restore, translation

FLAGS = flags.FLAGS


def define_flags() -> None:
  flags.DEFINE_string("workdir", None, "The run.", required=True)
  flags.DEFINE_string("huggingface", None, "Its export (export --format=huggingface).",
                      required=True)
  flags.DEFINE_enum("split", "eval", ["eval", "test"], "Which split of the run's data.")


def main():
  trained = restore.load_workdir(FLAGS.workdir)
  params, step = restore.restore_params(trained)
  sources, references = corpora.corpus(trained.cfg.data).split(FLAGS.split)
  generation = json.loads(open(os.path.join(FLAGS.huggingface,
                                            "generation_config.json")).read())
  run = trained.cfg.decode
  alike = dataclasses.replace(run, length_penalty=generation["length_penalty"],
                              length_penalty_form="fairseq", finish_within_beam=True)
  outputs = {
      "this project, the run's decoding": translation.translate(
          params, trained.model, trained.tokenizer, sources, run),
      "transformers, generation_config.json": huggingface.translate_huggingface(
          FLAGS.huggingface, sources),
      "this project, transformers' penalty and finishing rule": translation.translate(
          params, trained.model, trained.tokenizer, sources, alike),
      "transformers, this project's length limit": huggingface.translate_huggingface(
          FLAGS.huggingface, sources, max_extra_length=run.max_extra_length)}
  print(f"{FLAGS.workdir} step {step}, {len(sources)} {FLAGS.split} sentences")
  for name, hyps in outputs.items():
    score = bleu.score_translations(hyps, references, trained.cfg.data.target_lang)["bleu"]
    print(f"  {name}: sacreBLEU {score:.2f}")
  names = list(outputs)
  for a, b in ((0, 1), (2, 3)):
    same = sum(x == y for x, y in zip(outputs[names[a]], outputs[names[b]]))
    print(f"  identical outputs, {names[a]} / {names[b]}: {same} of {len(sources)}")
  encoded, tok = trained.tokenizer.encode(sources), trained.tokenizer
  differ = [i for i, (x, y) in enumerate(zip(outputs[names[2]], outputs[names[3]])) if x != y]
  at_limit = sum(len(tok.encode([outputs[names[2]][i]], target=True)[0])
                 >= len(encoded[i]) + run.max_extra_length for i in differ)
  print(f"  of the {len(differ)} that differ set alike, {at_limit} reached the length limit")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
