r"""Launch an experiment's trials: locally, on a SLURM GPU cluster, or on a TPU pod.

  python -m launch --experiment=experiments/multi30k_lr_warmup.py --target=local
  python -m launch --experiment=experiments/table3.py --target=slurm --nodes=1 \
      --gpus_per_node=8 --root=/shared/runs --dry_run
  python -m launch --experiment=experiments/big_reproduction.py --target=tpu \
      --tpu_name=my-v5p-64 --zone=us-east5-a --root=gs://bucket/runs

Each trial runs in ROOT/EXPERIMENT/TRIAL; launching again skips finished trials and
resumes unfinished ones. --dry_run prints exactly what would be run or submitted.
Compare the trials afterwards with `python -m launch.results`.
"""

import os
import sys

from absl import flags

from launch import launcher, sweep
from transformer_jax import cli

FLAGS = flags.FLAGS
flags.DEFINE_string("experiment", None, "Experiment file, e.g. experiments/table3.py.",
                    required=True)
flags.DEFINE_enum("target", "local", ["local", "slurm", "tpu"], "Where the trials run.")
flags.DEFINE_string("root", "runs", "Directory (or gs:// bucket) that holds the workdirs.")
flags.DEFINE_bool("dry_run", False, "Print what would be run or submitted; run nothing.")
flags.DEFINE_multi_string("set", [], "PATH=VALUE config override for every trial, e.g. "
                          "--set=data.manual_dir=/data/multi30k.")
flags.DEFINE_multi_string("trials", [], "Only this trial (by name); repeatable.")
flags.DEFINE_bool("smoke", False, "Use the config's ',smoke' variant: a tiny quick check.")
flags.DEFINE_integer("processes", 1, "local: processes per trial (multi-process runs).")
flags.DEFINE_integer("nodes", 1, "slurm: nodes per trial.")
flags.DEFINE_integer("gpus_per_node", 8, "slurm: GPUs per node (one process each).")
flags.DEFINE_string("partition", None, "slurm: partition.")
flags.DEFINE_string("time", None, "slurm: time limit, e.g. 48:00:00.")
flags.DEFINE_string("repo_dir", os.getcwd(), "slurm/tpu: this repository's path there.")
flags.DEFINE_string("tpu_name", None, "tpu: the TPU VM's name.")
flags.DEFINE_string("zone", None, "tpu: its zone.")
flags.DEFINE_string("project", None, "tpu: its Google Cloud project (default: gcloud's).")


def main():
  experiment = sweep.load_experiment_or_exit(FLAGS.experiment)
  extra = []
  for item in FLAGS.set:
    if "=" not in item:
      cli.fail(f"--set={item!r}: expected PATH=VALUE.")
    extra.append(tuple(item.split("=", 1)))
  runs = launcher.plan(experiment, FLAGS.root, extra, FLAGS.smoke)
  if FLAGS.trials:
    unknown = sorted(set(FLAGS.trials) - {r.trial.name for r in runs})
    if unknown:
      cli.fail(f"--trials: unknown trials {unknown}; this experiment has "
                       f"{[r.trial.name for r in runs]}.")
    runs = [r for r in runs if r.trial.name in FLAGS.trials]
  print(f"# {experiment.name}: {len(runs)} trials, target {FLAGS.target}")

  if FLAGS.target == "local":
    sys.exit(1 if launcher.launch_local(experiment, runs, FLAGS.processes,
                                        FLAGS.dry_run) else 0)
  if FLAGS.target == "slurm":
    print(launcher.launch_slurm(experiment, runs, FLAGS.dry_run,
                                nodes=FLAGS.nodes, gpus_per_node=FLAGS.gpus_per_node,
                                partition=FLAGS.partition, time_limit=FLAGS.time,
                                repo_dir=FLAGS.repo_dir))
    return
  if not FLAGS.tpu_name or not FLAGS.zone:
    cli.fail("--target=tpu needs --tpu_name and --zone.")
  sys.exit(1 if launcher.launch_tpu(runs, FLAGS.dry_run, tpu_name=FLAGS.tpu_name,
                                    zone=FLAGS.zone, project=FLAGS.project,
                                    repo_dir=FLAGS.repo_dir) else 0)


if __name__ == "__main__":
  cli.run(main)
