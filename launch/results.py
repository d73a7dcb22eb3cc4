r"""Compare the trials of an experiment: a sorted table, a CSV and learning curves.

  python -m launch.results --experiment=experiments/multi30k_lr_warmup.py --root=runs \
      --sort=eval/bleu --csv=results.csv --plot=curves.png --curve=eval/loss

Reads each trial's TensorBoard event files in ROOT/EXPERIMENT/TRIAL (--smoke: the
trials launched with --smoke), and prints each finished trial's last line (its test
split's scores) from its logs there. ROOT and the output files may be local or gs://.
"""

from __future__ import annotations

import csv
import difflib
import io
import json
import time
from typing import Any

import numpy as np
from absl import flags
from etils import epath

from launch import search, study as study_lib, sweep, trials as trials_lib
from transformer_jax import cli, config as config_lib, files, summaries

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import)."""
  flags.DEFINE_string("experiment", None, "Experiment file.", required=True)
  flags.DEFINE_string("root", "runs", "Directory (or gs:// bucket) that holds the "
                      "workdirs.")
  flags.DEFINE_bool("smoke", False, "Compare the trials launched with --smoke.")
  flags.DEFINE_string("sort", "eval/bleu", "Metric to sort by (best value).")
  flags.DEFINE_string("csv", None, "Write the table here as CSV.")
  flags.DEFINE_string("plot", None, "Draw the curves of --curve for all trials into this "
                      "PNG.")
  flags.DEFINE_string("curve", "eval/loss", "Metric whose learning curves --plot draws.")
  flags.DEFINE_string("storage", None, "A search's study, as given to launch (default: "
                      "where the search was launched, ROOT/EXPERIMENT/storage.json, else "
                      "$TRANSFORMER_JAX_STORAGE, else ROOT/EXPERIMENT/study.db); with "
                      "--plot=X.png, its optimization history, parameter importances, "
                      "intermediate values and parallel coordinates go beside X.png.")

COLUMNS = ("trial", "status", "best eval/bleu", "final eval/bleu", "best eval/loss",
           "final eval/loss", "kept best", "test", "test paper BLEU", "test sacreBLEU",
           "steps", "tokens/s", "train min", "overrides")
SHOWN = COLUMNS[:-1]  # The trial's name already spells its overrides; the CSV has both.
LEGEND = """\
status: not started (no config.json yet); failed at start-up (its launch.log says why:
  bad input, say); running (started, no end recorded: also a run
  killed without warning; see "updated"); finished (results.json); stopped (a signal,
  after checkpointing: launch again to resume); disk full (no space for a checkpoint:
  free some, launch again); non-finite (stopped on non-finite values); failed (an
  error: see WORKDIR/exit.json).
best/final: over the evaluations so far (their checkpoints may be gone); kept best: the
  checkpoint that train.keep_best_by kept (WORKDIR/best; --step=best uses it); test: the
  test split the finished run scored at the end (train.final_test), with the paper's
  tokenized, compound-split BLEU and sacreBLEU (results.json); steps:
  the last step with metrics; tokens/s: mean non-pad target tokens per second; train
  min: minutes spent training, each log window's steps at its own steps/s (evaluations
  between windows included; start-up, compilation and any time a trial was stopped
  not)."""
SEARCH_LEGEND = """\
status: the study's state of the trial: complete; pruned at step N (evaluation K of the
  metric: the pruner stopped it there, never resumed); diverged (its loss went
  non-finite: failed in the study, so that no sampler ranks it above another, and not
  retried); failed (its reason; retried in its workdir up to the search's retries, each
  retry shown as NAME (#NUMBER)); running; added from EXPERIMENT (a finished trial of a
  grid or earlier search, --warm_start: not in the budget).
value: what the sampler learned from it: the best of the search's metric over its
  evaluations (pruned: the last it reported; diverged, failed, running: none).
The other columns as for any trial:"""
_ENDED = {75: "stopped", 74: "disk full", 3: "non-finite"}


def trial_status(workdir: str) -> str:
  """not started, running, finished, stopped, disk full, non-finite or failed (LEGEND)."""
  path = epath.Path(workdir)
  if (path / "results.json").exists():
    return "finished"
  if (path / "exit.json").exists():
    return _ENDED.get(json.loads((path / "exit.json").read_text())["code"], "failed")
  if (path / "config.json").exists():
    return "running"
  log = path / "launch.log"  # Launched, but stopped before it wrote its config.
  return "failed at start-up (launch.log)" if log.exists() and log.read_text().strip() \
      else "not started"


def test_scores(workdir: str) -> dict[str, Any]:
  """The test split a finished run scored at its end (results.json), or Nones."""
  path = epath.Path(workdir) / "results.json"
  test = json.loads(path.read_text()).get("test", {}) if path.exists() else {}
  return {"test": test.get("set"), "test paper BLEU": test.get("paper_bleu"),
          "test sacreBLEU": test.get("bleu")}


def final_line(workdir: str) -> str | None:
  """The run's last line, its test split's scores ("Test SET (...): paper-style BLEU
  ..."), as a log in the workdir has it: the workers' logs a TPU trial copied to
  logs/ before its TPU was deleted, or a local trial's launch.log; else as results.json
  records it (a log copied before the line reached it, a SLURM trial's log beside the
  experiment, or none kept); None for a run without a test split, or not finished."""
  path = epath.Path(workdir)
  logs = sorted((path / "logs").glob("*.log")) if (path / "logs").exists() else []
  for log in [*logs, path / "launch.log"]:
    if log.exists():
      tests = [line for line in log.read_bytes().decode("utf-8", "replace").splitlines()
               if line.startswith("Test ")]
      if tests:
        return tests[-1]
  results = path / "results.json"
  test = json.loads(results.read_text()).get("test") if results.exists() else None
  if not test:
    return None
  from transformer_jax.training import run_files  # Heavy (JAX, Orbax): only here.
  return run_files.test_line(test)


def _best(series, tag):
  if not series:
    return None
  values = [v for _, v, _ in series]
  return min(values) if config_lib.lower_is_better(tag) else max(values)


def kept_best(workdir: str) -> str | None:
  """'METRIC VALUE @STEP' of the checkpoint that train.keep_best_by kept, if it is there
  (in checkpoints/; a run from before the best joined them kept it in best/)."""
  for record, kept in (("best.json", "checkpoints"), ("best/best.json", "best")):
    path = epath.Path(workdir) / record
    if path.exists():
      best = json.loads(path.read_text())
      if best.get("step") is None or not (epath.Path(workdir) / kept / str(best["step"])
                                          ).exists():
        return None
      return f"{best['metric']} {best['value']:.4g} @{best['step']}"
  return None


def train_minutes(scalars: dict[str, list[tuple[int, float, float]]]) -> float | None:
  """Minutes spent training: each log window's new steps at that window's own steps/s,
  added up, so start-up, compiling and the time between a stop and its resume never
  count (a window that repeats steps after a resume adds only the new ones)."""
  windows = sorted(scalars.get("train/steps_per_sec", []), key=lambda entry: entry[2])
  seconds, done = 0.0, 0
  for step, steps_per_sec, _ in windows:
    if step > done and steps_per_sec > 0:
      seconds += (step - done) / steps_per_sec
    done = max(done, step)
  return seconds / 60 if windows else None


def summarize(trial: sweep.Trial, workdir: str) -> dict[str, Any]:
  scalars = summaries.read_scalars(workdir)
  walls = [w for series in scalars.values() for _, _, w in series]
  steps = [s for series in scalars.values() for s, _, _ in series]
  speed = [v for _, v, _ in scalars.get("train/target_tokens_per_sec", [])]
  final = lambda tag: scalars[tag][-1][1] if scalars.get(tag) else None
  status = trial_status(workdir)
  if status == "running" and walls:
    status += f" (updated {(time.time() - max(walls)) / 60:.0f} min ago)"
  return {"trial": trial.name, "status": status,
          "overrides": " ".join(f"{k}={sweep.format_value(v)}" for k, v in trial.overrides),
          "best eval/bleu": _best(scalars.get("eval/bleu"), "eval/bleu"),
          "final eval/bleu": final("eval/bleu"),
          "best eval/loss": _best(scalars.get("eval/loss"), "eval/loss"),
          "final eval/loss": final("eval/loss"),
          "kept best": kept_best(workdir),
          **test_scores(workdir),
          "steps": max(steps) if steps else 0,
          "tokens/s": float(np.mean(speed)) if speed else None,
          "train min": train_minutes(scalars),
          "_params": dict(trial.overrides), "_scalars": scalars,
          "_final_line": final_line(workdir) if status == "finished" else None}


def table(rows: list[dict[str, Any]], sort: str) -> list[dict[str, Any]]:
  """Rows sorted by the best value of `sort` (trials without it last)."""
  sign = 1 if config_lib.lower_is_better(sort) else -1
  key = lambda r: (r["_sort"] is None, sign * (r["_sort"] or 0.0))
  for row in rows:
    row["_sort"] = _best(row["_scalars"].get(sort), sort)
  return sorted(rows, key=key)


def _cell(value) -> str:
  if value is None:
    return "-"
  return f"{value:.4g}" if isinstance(value, float) else str(value)


def format_table(rows: list[dict[str, Any]], searched: bool = False) -> str:
  """The table; a search's has each trial's value and values ("overrides")."""
  shown = ("trial", "status", "value", *SHOWN[2:], "overrides") if searched else SHOWN
  shown = [c for c in shown if not c.startswith("test") or any(r.get(c) is not None for r in rows)]
  cells = [list(shown)] + [[_cell(r.get(c)) for c in shown] for r in rows]
  widths = [max(len(row[i]) for row in cells) for i in range(len(shown))]
  return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells)


def write_csv(rows, path: str) -> None:
  """The table's columns, then each overridden field in a column of its own."""
  text = io.StringIO()
  writer = csv.writer(text)
  columns = COLUMNS + ("value",) * any("value" in r for r in rows)
  params = sorted({path for r in rows for path in r["_params"]})
  writer.writerow(columns + tuple(params))
  writer.writerows([[r.get(c) for c in columns] + [r["_params"].get(p) for p in params]
                    for r in rows])
  files.write_atomic(path, text.getvalue())


def plot_curves(rows, metric: str, path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(8, 5))
  for row in rows:
    series = row["_scalars"].get(metric)
    if series:
      ax.plot([s for s, _, _ in series], [v for _, v, _ in series], marker=".",
              label=row["trial"])
  ax.set_xlabel("step")
  ax.set_ylabel(metric)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  png = io.BytesIO()
  fig.savefig(png, format="png", dpi=120)
  plt.close(fig)
  files.write_atomic(path, png.getvalue())


def collect(experiment: sweep.Experiment, root: str, sort: str, smoke: bool = False,
            study=None) -> list[dict[str, Any]]:
  """A row per trial, best first: a search's from its study (`study`), each with its
  state, its value and, if pruned, the step it was stopped at."""
  if study is None:
    runs = trials_lib.plan(experiment, root, smoke=smoke)
    return table([summarize(r.trial, r.workdir) for r in runs], sort)
  rows = []
  for frozen in study.get_trials(deepcopy=False):
    if ("retry_of" in frozen.user_attrs and not frozen.state.is_finished()) or \
        frozen.user_attrs.get("over_budget"):
      continue
    name = frozen.user_attrs.get("name", search.trial_name(frozen.number))
    workdir = frozen.user_attrs.get(
        "workdir", str(trials_lib.experiment_dir(experiment, root, smoke) / name))
    row = summarize(sweep.Trial(name, tuple(sorted(frozen.params.items()))), workdir)
    row["status"] = _search_status(frozen, workdir)
    row["trial"] = f"{name} (#{frozen.number})" if "retry_of" in frozen.user_attrs else name
    row["value"] = frozen.value
    rows.append(row)
  rows = table(rows, sort)
  sign = -1 if experiment.search.direction == "maximize" else 1
  return sorted(rows, key=lambda r: (r["value"] is None, sign * (r["value"] or 0.0)))


def _search_status(frozen, workdir: str) -> str:
  """A searched trial's state: complete, diverged, pruned at step N (evaluation K),
  failed (why), running, or added from another experiment."""
  attrs = frozen.user_attrs
  if "warm_start" in attrs:
    return f"added from {attrs['warm_start']} (--warm_start)"
  if "diverged" in attrs:
    return "diverged (failed: not retried)"
  status = frozen.state.name.lower().replace("fail", "failed")
  pruned = epath.Path(workdir, "pruned.json")
  if frozen.state.name == "PRUNED" and pruned.exists():
    at = json.loads(pruned.read_text())
    status += f" at step {at['step']}" + (
        f" (evaluation {at['evaluation']})" if "evaluation" in at else "")
  return status + (f" ({attrs['failure']})" if "failure" in attrs else "")


def check_metric(flag: str, metric: str, rows: list[dict[str, Any]]) -> None:
  """Exits 2 naming the metrics the trials wrote if none wrote `metric` (and some
  wrote metrics: trials not started yet have none)."""
  written = sorted({tag for row in rows for tag in row["_scalars"]})
  if written and metric not in written:
    close = difflib.get_close_matches(metric, written, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    cli.fail(f"--{flag}={metric!r}: no trial wrote this metric{hint}; they wrote: "
             f"{', '.join(written)}.")


def plot_study(study, path: str) -> list[str]:
  """Optuna's optimization history, intermediate values (each trial's metric at each
  evaluation: where the pruner stopped it), parallel coordinates and parameter
  importances (matplotlib), as PNGs beside `path`; the last two need two finished
  trials. Returns what it wrote."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from optuna.visualization import matplotlib as optuna_plots

  done = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
  plots = {"history": optuna_plots.plot_optimization_history,
           "intermediate": optuna_plots.plot_intermediate_values}
  if len(done) >= 2:
    plots["parallel"] = optuna_plots.plot_parallel_coordinate
    plots["importances"] = optuna_plots.plot_param_importances
  written = []
  for name, plot in plots.items():
    axes = plot(study)
    png = io.BytesIO()
    axes.figure.set_size_inches(8, 5)
    axes.figure.tight_layout()
    axes.figure.savefig(png, format="png", dpi=120)
    plt.close(axes.figure)
    out = path.removesuffix(".png") + f"_{name}.png"
    files.write_atomic(out, png.getvalue())
    written.append(out)
  return written


def main():
  experiment = sweep.load_experiment_or_exit(FLAGS.experiment)
  study = None
  if experiment.search is not None:
    storage = study_lib.resolve_storage(experiment, FLAGS.root, FLAGS.smoke, FLAGS.storage)
    study = study_lib.open_study(experiment, storage, create=False)
    if study is None:
      print(f"{experiment.name}: no study in {study_lib.masked(storage)} yet: launch the "
            "search first")
      return
  rows = collect(experiment, FLAGS.root, FLAGS.sort, FLAGS.smoke, study)
  check_metric("sort", FLAGS.sort, rows)
  if FLAGS.plot:
    check_metric("curve", FLAGS.curve, rows)
  order = (f"best {experiment.search.metric} first (the study's value)" if study else
           f"sorted by best {FLAGS.sort}")
  print(f"{experiment.name}: {len(rows)} trials in "
        f"{trials_lib.experiment_dir(experiment, FLAGS.root, FLAGS.smoke)}, {order}")
  print(format_table(rows, study is not None))
  if study:
    print(search.spent(study.get_trials(deepcopy=False), experiment.search))
  for row in rows:
    if row["_final_line"]:
      print(f"{row['trial']}: {row['_final_line']}")
  if study:
    print(SEARCH_LEGEND)
    if best := search.best_again(study, experiment):
      print(best)
  print(LEGEND)
  if FLAGS.csv:
    write_csv(rows, FLAGS.csv)
    print(f"wrote {FLAGS.csv}")
  if FLAGS.plot:
    plot_curves(rows, FLAGS.curve, FLAGS.plot)
    print(f"wrote {FLAGS.plot} ({FLAGS.curve})")
    for path in plot_study(study, FLAGS.plot) if study else ():
      print(f"wrote {path}")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
