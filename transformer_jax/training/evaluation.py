"""What a training run scores of itself: the loss on held-out pairs and BLEU at their
cadences while it trains (`after_step`, which also checkpoints when due), and the final
evaluation (`final`): the held-out set and the test split translated with the mean of
the last checkpoints (train.average_last). `evaluate.py` scores a finished run's
checkpoints the same way, from the command line.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Sequence

from etils import epath

from transformer_jax import partitioning, summaries
from transformer_jax.data import batching, parallel_data, tasks
from transformer_jax.inference import bleu, restore, translation
from transformer_jax.training import averaging, cadence, early_stopping, metrics, run_ahead
from transformer_jax.training import run as run_lib, saving
from transformer_jax.training.step import TrainState


def after_step(run: run_lib.Run, state: TrainState, task: tasks.Task, saver: saving.Saver,
               writer: summaries.SummaryWriter, workdir: str, best: early_stopping.Best,
               done: int, scores: dict | None) -> tuple[bool, dict | None]:
  """The loss on held-out pairs, BLEU (at the last step unless the final evaluation
  averages checkpoints: train.average_last) and a checkpoint, each when due after step
  `done` (a checkpoint deferred while the previous one is written: saving.Saver); a
  checkpoint of this step when train.keep_best_by improves or its patience is spent,
  saved with the metric's value. Returns whether the patience is spent, and the latest
  BLEU scores."""
  cfg, last, spent = run.cfg.train, run.cfg.train.num_train_steps, False
  if cadence.due(done, cfg.eval_every_steps, last):
    scalars = {f"eval/{k}": v for k, v in evaluate_loss(run, state.params, task.eval).items()}
    writer.write_scalars(done, scalars)
    spent |= best.update(done, scalars)
  if cadence.bleu_due(done, cfg.bleu_every_steps, last, cfg.average_last):
    scores = evaluate_translation(state.params, run.model, task, run.cfg, workdir, done,
                                  writer)
    spent |= best.update(done, {f"eval/{k}": scores[k] for k in bleu.SCORES})
  saver.after_step(done, state, now=spent or best.improved(done), metrics=best.metrics(done))
  return spent, scores


def final(run: run_lib.Run, state: TrainState, average: averaging.Window, task: tasks.Task,
          workdir: str, writer: summaries.SummaryWriter, scores: dict | None
          ) -> dict[str, Any]:
  """The final evaluation, with the mean of the last train.average_last checkpoints
  (averaging.final_params): BLEU on the held-out pairs (the latest `scores` where they
  are of the last step's parameters alone), and the test split (`evaluate_test`)."""
  cfg, step = run.cfg, int(state.step)
  params, averaged = averaging.final_params(state, average, workdir, cfg.train)
  if len(averaged) < cfg.train.average_last:
    logging.warning("the final evaluation averages %d checkpoint(s) %s, fewer than "
                    "train.average_last=%d: no more were written or kept up to step %d",
                    len(averaged), averaged, cfg.train.average_last, averaged[-1])
  held_out = scores if scores and scores["step"] == step and len(averaged) == 1 \
      else evaluate_translation(params, run.model, task, cfg, workdir, step, writer, averaged)
  return {**held_out, "test": evaluate_test(params, run.model, task, cfg, workdir, step,
                                            averaged)}


def results(final_scores: dict[str, Any], step: int, best: early_stopping.Best
            ) -> dict[str, Any]:
  """What results.json records of the final evaluation: the scores, the checkpoints
  averaged, the test split's; and where the best checkpoint is, and whether the run
  stopped early (train.keep_best_by)."""
  out = {k: final_scores[k] for k in (*bleu.SCORES, "signature", "averaged", "test")
         if final_scores.get(k) is not None}
  out["step"] = step
  if best.metric:
    out["best"] = {k: best.record[k] for k in ("metric", "value", "step", "stopped_at")}
  return out


def evaluate_loss(run: run_lib.Run, params, data: parallel_data.ParallelData
                  ) -> dict[str, float]:
  """Loss metrics over the first train.num_eval_batches batches of held-out pairs."""
  cfg, total, in_flight = run.cfg, None, run_ahead.InFlight()
  rows = run_lib.eval_rows(cfg, run.mesh)
  for i, batch in enumerate(batching.eval_batches(data, rows, cfg.data.max_length)):
    if i >= cfg.train.num_eval_batches:
      break
    total = metrics.merge(total, run.eval_step(params,
                                               partitioning.shard_batch(batch, run.mesh)))
    in_flight.add(total)
  return metrics.summary(total)


def evaluate_translation(params, model, task, cfg, workdir, step, writer,
                         averaged: Sequence[int] = ()) -> dict[str, Any]:
  """BLEU on the held-out pairs at `step`, with the parameters of that step or the mean
  of checkpoints `averaged` (then in the log, its file name and the scores)."""
  start = time.time()
  mean = len(averaged) > 1
  scores = translation.translate_and_score(
      params, model, task.tokenizer, task.eval_sources, task.eval_references, cfg.decode,
      cfg.data.target_lang, epath.Path(workdir) / "translations" /
      f"{restore.averaged_name(f'step_{step}', len(averaged))}.txt")
  writer.write_scalars(step, {f"eval/{k}": scores[k] for k in bleu.SCORES})
  logging.info("step %d%s: sacreBLEU %.2f (paper-style %.2f), exact match %.1f%% on %d "
               "held-out pairs (%.0f s) [%s]", step,
               f", the mean of checkpoints {list(averaged)}" if mean else "", scores["bleu"],
               scores["paper_bleu"], 100 * scores["exact_match"], len(scores["hypotheses"]),
               time.time() - start, scores["signature"])
  return {**scores, "step": step, **({"averaged": list(averaged)} if mean else {})}


def evaluate_test(params, model, task, cfg, workdir, step, averaged: Sequence[int]
                  ) -> dict[str, Any] | None:
  """The data's test split (WMT14: newstest2014) translated with the final evaluation's
  parameters, beam and alpha, and scored as the paper did and by sacreBLEU, beside the
  paper's figure for train.paper_row where the dataset has one (`paper_figure`); None
  without train.final_test or a test split (then one line says why). Nothing is chosen
  on it."""
  if not cfg.train.final_test:
    return None
  corpus = task.corpus
  if (name := corpus.test_set()) is None:
    logging.info("no test split scored: %s", corpus.no_test_set())
    return None
  start = time.time()
  sources, references = corpus.split("test")
  scores = translation.translate_and_score(
      params, model, task.tokenizer, sources, references, cfg.decode, cfg.data.target_lang,
      epath.Path(workdir) / "translations" /
      f"{restore.averaged_name(f'{name}_step_{step}', len(averaged))}.txt")
  logging.info("step %d: %s translated in %.0f s", step, name, time.time() - start)
  return {"set": name, "sentences": len(sources),
          **{k: scores[k] for k in ("paper_bleu", "paper_bleu_2018", "bleu", "signature")},
          "averaged": list(averaged), "beam_size": cfg.decode.beam_size,
          "alpha": cfg.decode.length_penalty, "paper_row": cfg.train.paper_row,
          "paper": corpus.paper_figure(cfg.train.paper_row)}
