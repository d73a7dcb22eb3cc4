r"""Launch an experiment's trials: locally, on a SLURM GPU cluster, or on Cloud TPUs.

  python -m launch --experiment=experiments/multi30k_lr_warmup.py --target=local
  python -m launch --experiment=experiments/table3.py --target=slurm --nodes=1 \
      --gpus_per_node=8 --root=/shared/runs --activate='source ~/venv/bin/activate'
  python -m launch --experiment=experiments/big_reproduction.py --target=tpu \
      --tpu_name=big --zone=us-east5-a --accelerator_type=v5p-64 --spot \
      --root=gs://bucket/runs

Each trial runs in ROOT/EXPERIMENT/TRIAL; launching again skips finished trials and
resumes unfinished ones. The code that runs on a cluster or TPU is this working tree,
shipped there (uncommitted changes included) and recorded in each trial's trial.json.
With --accelerator_type the launcher creates a TPU per trial, recreates it after a
preemption and deletes it when the trial has its results.json; it watches until every
trial is done (Ctrl-C stops the watching only). --dry_run prints what would be run, and
each trial's cost in hours and device-hours, part by part (planning/cost.py).
Compare the trials afterwards with `python -m launch.results`.
"""

import os
import sys

from absl import flags

from launch import search as search_lib, study as study_lib, sweep, trials as trials_lib
from launch import warm_start
from launch.targets import TARGETS
from transformer_jax import cli, config as config_lib, files

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags, then every target's own (launch/targets/), defined when it runs
  (not on import)."""
  flags.DEFINE_string("experiment", None, "Experiment file, e.g. experiments/table3.py.",
                      required=True)
  flags.DEFINE_string("target", "local", "Where the trials run: "
                      f"{', '.join(TARGETS.names())} (a module of launch/targets/ each; "
                      "a flag whose help starts with a target's name is its own).")
  flags.DEFINE_string("root", "runs", "Directory (or gs:// bucket) that holds the "
                      "workdirs.")
  flags.DEFINE_bool("dry_run", False, "Print what would be run or submitted; run nothing.")
  flags.DEFINE_multi_string("set", [], "PATH=VALUE config override for every trial, e.g. "
                            "--set=data.manual_dir=/data/multi30k.")
  flags.DEFINE_multi_string("trials", [], "Only this trial (by name); repeatable.")
  flags.DEFINE_string("storage", None, "A search's study (experiments that define SEARCH): "
                      "an SQLAlchemy URL (sqlite:///PATH, postgresql://USER@HOST/DB) or "
                      "journal:PATH (a file on a shared filesystem), no password in it "
                      "(~/.pgpass holds it); default: where the search was launched "
                      "before (ROOT/EXPERIMENT/storage.json), else "
                      f"${study_lib.STORAGE_ENV} (a URL with a password may be there), "
                      "else SQLite in ROOT/EXPERIMENT/study.db (slurm: a journal there).")
  flags.DEFINE_multi_string("warm_start", [], "A search starts from the finished trials "
                            "of this experiment file (a grid, or an earlier search) under "
                            "the same --root, added to its study with their values once; "
                            "repeatable.")
  flags.DEFINE_bool("allow_search_change", False, "Go on with a study created with "
                    "another SEARCH (space, metric, sampler, pruner or seed) or another "
                    "config for its trials (CONFIG, --set), storing the new one in it.")
  flags.DEFINE_bool("smoke", False, "Use the config's ',smoke' variant: a tiny quick "
                    "check.")
  flags.DEFINE_bool("prepare_data", True, "A trial of several processes has its data "
                    "(TFDS's dataset, the tokenizer, the tokenized training split) "
                    "prepared once, in one process, before its processes start: they "
                    "build nothing. --prepare_data=false: it was prepared beforehand "
                    "(python -m transformer_jax.main ... --prepare_data).")
  flags.DEFINE_bool("ship", True, "slurm/tpu: ship this working tree and run it there. "
                    "--noship runs the code already at --repo_dir on every machine.")
  flags.DEFINE_string("repo_dir", None, "slurm/tpu with --noship: the repository's path "
                      "on every machine.")
  flags.DEFINE_bool("allow_code_change", False, "Resume trials launched with other code; "
                    "a search: go on with a study whose trials ran other code (its "
                    "fingerprint, stored in the study, then this code's).")
  flags.DEFINE_float("poll_s", None, "Seconds between looks at a running trial (default: "
                     "the target's; tpu, 60, at each TPU; local, 10, at the trials another "
                     f"launcher trains; a search here, {search_lib.POLL_S:g}, at its "
                     "trial's new evaluations).")
  flags.DEFINE_string("cost_on", None, "--dry_run: print each trial's cost on these "
                      "accelerators, as benchmark --topology names them (8xH100, 16xH200, "
                      "v5p-64); default: local, this machine's own GPUs; slurm, NODES x "
                      "GPUS_PER_NODE H100s; tpu, --accelerator_type.")
  flags.DEFINE_float("checkpoint_mb_per_s", 200.0, "The cost's checkpoint writes at this "
                     "bandwidth to --root, MB/s.")
  targets = [TARGETS.get(name, "--target") for name in TARGETS.names()]
  for define in {target.define_flags for target in targets}:
    define()  # (A target that subclasses another shares its flags: defined once.)
  for module in {sys.modules[target.__module__] for target in targets}:
    flags.adopt_module_key_flags(module)  # --help lists them with the command's own.


def main():
  experiment = sweep.load_experiment_or_exit(FLAGS.experiment)
  try:
    target = TARGETS.get(FLAGS.target, "--target")(FLAGS)
  except config_lib.InputError as e:
    cli.fail(str(e))
  extra = []
  for item in FLAGS.set:
    if "=" not in item:
      cli.fail(f"--set={item!r}: expected PATH=VALUE.")
    extra.append(tuple(item.split("=", 1)))
  if experiment.search is not None:
    sys.exit(_search(experiment, target, extra))
  runs = trials_lib.plan(experiment, FLAGS.root, extra, FLAGS.smoke)
  if FLAGS.trials:
    unknown = sorted(set(FLAGS.trials) - {r.trial.name for r in runs})
    if unknown:
      cli.fail(f"--trials: unknown trials {unknown}; this experiment has "
               f"{[r.trial.name for r in runs]}.")
    runs = [r for r in runs if r.trial.name in FLAGS.trials]
  trials_lib.check_overrides(runs)
  if target.hosts() > 1:  # One machine's processes share its home, and TFDS's folder there.
    runs = trials_lib.shared_data(runs, FLAGS.root)
  print(f"# {experiment.name}: {len(runs)} trials, target {FLAGS.target}")
  sys.exit(target.launch(experiment, runs))


def _search(experiment, target, extra) -> int:
  """An experiment that defines SEARCH: checked, then run by the target."""
  if FLAGS.trials:
    cli.fail("--trials picks among an experiment's listed trials; a search draws its "
             "trials as it goes")
  target.check_search()
  if files.is_remote(FLAGS.root) and not (FLAGS.storage or
                                          os.environ.get(study_lib.STORAGE_ENV)):
    cli.fail(f"--root={FLAGS.root}: a bucket holds no SQLite study or journal; give "
             "--storage: a database URL, or a file on the launcher's machine, e.g. "
             f"--storage=sqlite:///$HOME/studies/{experiment.name}.db")
  storage = study_lib.resolve_storage(experiment, FLAGS.root, FLAGS.smoke, FLAGS.storage,
                                      target.study_journal)
  search_lib.check(experiment, FLAGS.root, extra, FLAGS.smoke)
  warm_start.prepare(experiment, storage, FLAGS.root, extra, FLAGS.smoke, FLAGS.warm_start,
                     FLAGS.dry_run, FLAGS.allow_search_change, target.search_code(),
                     FLAGS.allow_code_change)
  return target.search(experiment, extra, storage)


if __name__ == "__main__":
  define_flags()
  cli.run(main)
