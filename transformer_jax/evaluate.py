r"""Score translations: a trained model on a split or on any files, or a file of
hypotheses alone.

  python -m transformer_jax.evaluate --workdir=/tmp/run --split=test --average_last=5
  python -m transformer_jax.evaluate --workdir=/tmp/run --source=F --reference=R \
      [--beam_size=4 --length_penalty=0.6 | --ctranslate2=DIR | --huggingface=DIR]
  python -m transformer_jax.evaluate --hypotheses=H --reference=R [--target_lang=de]

--average_last=k averages the parameters of the last k checkpoints; by default those
the run's final score averaged: its train.average_last (the paper: 5 for base, 20 for
big), fewer if fewer are kept. --step picks the newest checkpoint to use. Prints
sacreBLEU with its signature, chrF, the paper's tokenized BLEU and lowercased BLEU.
With a workdir, the hypotheses go to WORKDIR/translations/NAME.txt and the scores to
WORKDIR/evaluate/: TensorBoard tags NAME/bleu, ... and one JSON line per evaluation in
results.jsonl. NAME says what was scored: the split or file, then _avgK (K checkpoints
averaged), _beamB, _lpA, _ct2 or _hf for what differs from the run's own decoding.
--huggingface translates with transformers and the exported folder's
generation_config.json (its --beam_size and --length_penalty in transformers' meaning:
|Y|^a).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from typing import Any

from absl import flags
from etils import epath

from transformer_jax import cli, config as config_lib, files, stop_policy, summaries
from transformer_jax.data import corpora
from transformer_jax.inference import bleu, ctranslate2 as ct2, huggingface as hf, restore
from transformer_jax.inference import translation

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import)."""
  flags.DEFINE_string("workdir", None, "Workdir of a training run (not needed with "
                      "--hypotheses); several, comma-separated: an ensemble, recorded in "
                      "the first.")
  flags.DEFINE_enum("split", "test", ["eval", "test"], "Which split of the run's data "
                    "(unless --source).")
  flags.DEFINE_string("source", None, "Translate this file (one sentence per line, "
                      "optionally .gz) instead of a split; needs --reference.")
  flags.DEFINE_string("reference", None, "The references of --source or --hypotheses.")
  flags.DEFINE_string("hypotheses", None, "Score this file of translations against "
                      "--reference; no model is run.")
  flags.DEFINE_integer("average_last", None, "Average the last k checkpoints (up to "
                       "--step); default: the run's train.average_last, fewer if "
                       "fewer are kept, as its final score (1 with --step=best).")
  flags.DEFINE_string("step", None, "Newest checkpoint to use (default: the latest; best: "
                      "the one train.keep_best_by kept).")
  flags.DEFINE_integer("beam_size", None, "Beam size (default: the run's "
                       "decode.beam_size).")
  flags.DEFINE_float("length_penalty", None, "alpha (default: decode.length_penalty).")
  flags.DEFINE_string("ctranslate2", None, "Translate with the CTranslate2 model exported "
                      "to this directory (python -m transformer_jax.export).")
  flags.DEFINE_string("huggingface", None, "Translate with transformers and the MarianMT "
                      "folder exported there (export --format=huggingface; needs "
                      "pip install -e '.[huggingface]').")
  flags.DEFINE_string("output_dir", None, "Where the translations and scores go "
                      "(default: the workdir; a read-only one: a folder under "
                      "~/.cache/transformer_jax/evaluate named after it).")
  flags.DEFINE_string("target_lang", None, "With --hypotheses: the references' language, "
                      "for the tokenized BLEUs (default: the run's data.target_lang, "
                      "else de).")


def result_name(data: str, average_last: int = 1, beam_size: int | None = None,
                length_penalty: float | None = None, exported: str = "",
                best: bool = False, runs: int = 1) -> str:
  """What an evaluation scored, as a file and tag name: `test`, `test_avg5_beam8_ct2`
  (`exported`: "ct2" or "hf", an exported model's engine)."""
  parts = [restore.averaged_name(data, average_last),
           f"beam{beam_size}" if beam_size is not None else "",
           f"lp{length_penalty:g}" if length_penalty is not None else "",
           exported, "best" if best else "",
           f"ens{runs}" if runs > 1 else ""]
  return "_".join(p for p in parts if p)


def output_dir(workdir: str, chosen: str | None = None) -> epath.Path:
  """Where an evaluation of `workdir` writes: `chosen`, else the workdir, else (a
  read-only run: shared, archived) a folder named after it under the user's cache,
  said in one line."""
  if chosen:
    return epath.Path(chosen)
  if files.writable(workdir):
    return epath.Path(workdir)
  absolute = os.path.abspath(workdir)
  name = f"{os.path.basename(absolute)}_{hashlib.sha256(absolute.encode()).hexdigest()[:8]}"
  out = epath.Path(os.path.expanduser("~/.cache/transformer_jax/evaluate")) / name
  logging.warning("%s is read-only: the translations and scores go to %s (--output_dir "
                  "picks another folder)", workdir, out)
  return out


def evaluate_checkpoints(workdir: str, split: str = "test", average_last: int | None = None,
                         step: int | str | None = None, beam_size: int | None = None,
                         length_penalty: float | None = None,
                         source: str | None = None, reference: str | None = None,
                         ctranslate2: str | None = None, out: str | None = None,
                         huggingface: str | None = None) -> dict[str, Any]:
  """Translates `split` (or the file `source`) with the (averaged) checkpoints, or with
  an exported CTranslate2 or MarianMT model, scores it and records the scores in `out`
  (default: `output_dir`'s). `average_last` None: each run's train.average_last."""
  runs = restore.load_ensemble(workdir.split(","))
  trained, workdir = runs[0], runs[0].workdir  # Decodes and records as the first run.
  out = output_dir(workdir, out)
  cfg = trained.cfg
  overrides = {k: v for k, v in (("beam_size", beam_size),
                                 ("length_penalty", length_penalty)) if v is not None}
  decode_cfg = dataclasses.replace(cfg.decode, **overrides)
  if source:
    sources, references = _read_pairs("source", source, reference)
  else:
    sources, references = corpora.corpus(cfg.data).split(split)
  exported = "ct2" if ctranslate2 else ("hf" if huggingface else "")
  averages = ([1 if average_last is None else average_last] if exported else
              [_average_last(run, average_last, step) for run in runs])
  name = result_name(_stem(source) if source else split, averages[0], beam_size,
                     length_penalty, exported, step == "best", len(runs))
  if exported and len(runs) > 1:  # The exported model, whichever checkpoints made it.
    raise ValueError(f"--{'ctranslate2' if ctranslate2 else 'huggingface'} scores one "
                     "exported model, not an ensemble.")
  chosen: list[int] = []
  if ctranslate2:
    model = f"the CTranslate2 model in {ctranslate2}"
    hyps = ct2.translate_ctranslate2(ct2.ctranslate2_translator(ctranslate2),
                                     trained.tokenizer, sources, decode_cfg)
  elif huggingface:
    model = f"the MarianMT model in {huggingface}, by transformers"
    hyps = hf.translate_huggingface(huggingface, sources, beam_size, length_penalty)
  else:
    params, chosen, model = _restore(runs, averages, step)
    hyps = translation.translate(*restore.ensemble(runs, params), trained.tokenizer,
                                 sources, decode_cfg)
  others = "".join(f"_with_{os.path.basename(os.path.normpath(run.workdir))}"
                   for run in runs[1:])  # Two ensembles of this run: two files.
  written = out / "translations" / (
      f"{name}_step{chosen[-1]}{others}.txt" if chosen else f"{name}{others}.txt")
  stop_policy.outputs_begin()  # Translations, then the scores: no stop between them.
  files.write_atomic(written, "".join(h + "\n" for h in hyps))
  result = {**bleu.score_translations(hyps, references, cfg.data.target_lang),
            "steps": chosen, "sentences": len(sources), "name": name, "model": model,
            "translations": str(written), "recorded": str(out / "evaluate")}
  record(out, result)
  return result


def _average_last(run: restore.TrainedModel, average_last: int | None,
                  step: int | str | None) -> int:
  """--average_last, or by default what the run's final score averaged: its
  train.average_last checkpoints, fewer if fewer are there up to `step` (the best: 1)."""
  if average_last is not None:
    return average_last
  if step == "best":
    return 1
  return len(restore.checkpoint_steps(run.workdir, run.cfg.train.average_last, step,
                                      at_most=True))


def _restore(runs: list[restore.TrainedModel], averages: list[int],
             step: int | str | None) -> tuple[list[Any], list[int], str]:
  """Each run's parameters (its best checkpoint, or the average of its last
  `averages[i]`), the first run's steps, and what they are, in words (each run's, for an
  ensemble)."""
  params, steps, words = zip(*(restore.chosen_params(run, k, step)
                                for run, k in zip(runs, averages)))
  if len(runs) == 1:
    return list(params), steps[0], words[0]
  return list(params), steps[0], "; ".join(f"{run.workdir}: {w}" for run, w in zip(runs, words))


def score_file(hypotheses: str, reference: str, target_lang: str,
               workdir: str | None = None, out: str | None = None) -> dict[str, Any]:
  """Scores a file of translations; with a workdir (or `out`), records them there too."""
  hyps, references = _read_pairs("hypotheses", hypotheses, reference)
  result = {**bleu.score_translations(hyps, references, target_lang),
            "steps": [], "sentences": len(hyps), "name": _stem(hypotheses),
            "model": f"the translations in {hypotheses}"}
  if workdir or out:
    where = output_dir(workdir, out)
    record(where, result)
    result["recorded"] = str(where / "evaluate")
  return result


def _read_pairs(flag: str, path: str, reference: str) -> tuple[list[str], list[str]]:
  """Aligned lines of --FLAG's file and --reference's; an empty pair is an InputError."""
  lines, references = corpora.read_parallel_files(path, reference)
  if not lines:
    raise config_lib.InputError(f"--{flag}={path} and --reference={reference} are empty: "
                                "nothing to score.")
  return lines, references


def record(out: epath.PathLike, result: dict[str, Any]) -> None:
  """Appends the scores to OUT/evaluate/results.jsonl and writes them to TensorBoard
  under NAME/..., at the newest checkpoint's step (0 for a scored file)."""
  directory = epath.Path(out) / "evaluate"
  step = result["steps"][-1] if result["steps"] else 0
  writer = summaries.SummaryWriter(directory)
  writer.write_scalars(step, {f"{result['name']}/{k}": result[k] for k in bleu.SCORES})
  writer.close()
  keep = ("name", "model", "steps", "sentences", *bleu.SCORES, "signature")
  files.append_line(directory / "results.jsonl", json.dumps({k: result[k] for k in keep}))


def _stem(path: str) -> str:
  name = os.path.basename(path.rstrip("/"))
  for suffix in (".gz", ".txt"):
    name = name.removesuffix(suffix)
  return name or "file"


def _check_flags() -> None:
  if FLAGS.hypotheses and (FLAGS.source or FLAGS.ctranslate2 or FLAGS.huggingface):
    cli.fail("--hypotheses scores a file: it takes no --source, --ctranslate2 or "
             "--huggingface.")
  if FLAGS.ctranslate2 and FLAGS.huggingface:
    cli.fail("--ctranslate2 and --huggingface: one exported model at a time.")
  if (FLAGS.hypotheses or FLAGS.source) and not FLAGS.reference:
    cli.fail(f"--{'hypotheses' if FLAGS.hypotheses else 'source'} needs --reference: "
             "the reference translations, one per line.")
  if not FLAGS.hypotheses and not FLAGS.workdir:
    cli.fail("--workdir is required (the run whose checkpoints translate), unless "
             "--hypotheses scores a file.")
  for flag in ("source", "hypotheses", "reference"):
    path = getattr(FLAGS, flag)
    if path and not epath.Path(path).exists():
      cli.fail(f"--{flag}={path} does not exist.")


def main():
  logging.getLogger().setLevel(logging.INFO)
  _check_flags()
  try:
    if FLAGS.hypotheses:
      lang = FLAGS.target_lang or (config_lib.load_workdir_config(FLAGS.workdir).data
                                   .target_lang if FLAGS.workdir else "de")
      r = score_file(FLAGS.hypotheses, FLAGS.reference, lang, FLAGS.workdir,
                     FLAGS.output_dir)
    else:
      r = evaluate_checkpoints(FLAGS.workdir, FLAGS.split, FLAGS.average_last,
                               restore.parse_step(FLAGS.step),
                               FLAGS.beam_size, FLAGS.length_penalty, FLAGS.source,
                               FLAGS.reference, FLAGS.ctranslate2, FLAGS.output_dir,
                               FLAGS.huggingface)
  except (FileNotFoundError, RuntimeError, ValueError) as e:
    cli.fail(str(e))
  print(f"{r['name']}: {r['sentences']} sentences, {r['model']}\n"
        f"  sacreBLEU {r['bleu']:.2f}  [{r['signature']}]\n"
        f"  sacreBLEU -lc (lowercased) {r['bleu_lc']:.2f}\n"
        f"  chrF {r['chrf']:.2f}\n"
        f"  paper-style tokenized, compound-split BLEU {r['paper_bleu']:.2f} "
        f"(tensor2tensor's script since 2018: {r['paper_bleu_2018']:.2f})\n"
        f"  Multi30k-style lowercased, tokenized BLEU {r['lowercase_bleu']:.2f}")
  if "translations" in r:
    print(f"  translations: {r['translations']}")
  if "recorded" in r:
    print(f"recorded in {r['recorded']} (results.jsonl, TensorBoard {r['name']}/...)")


if __name__ == "__main__":
  define_flags()
  cli.run(main, stopped="before the scores were recorded: nothing of this evaluation was "
          "recorded, and every file it writes is whole or not there.")
