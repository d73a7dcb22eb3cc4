"""Turn an experiment's trials into runs: locally, as a SLURM array job, on a TPU pod.

Each trial trains in ROOT/EXPERIMENT/TRIAL (named from its overrides), where the run
saves its resolved config; a trial whose workdir has results.json is finished and is
skipped, and an unfinished one resumes from its latest checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
from typing import Sequence

from etils import epath

from launch.sweep import Experiment, Trial, format_value


@dataclasses.dataclass(frozen=True)
class Run:
  trial: Trial
  workdir: str
  args: tuple[str, ...]  # After "python -m transformer_jax.main".


def plan(experiment: Experiment, root: str, extra: Sequence[tuple[str, str]] = (),
         smoke: bool = False) -> list[Run]:
  """One Run per trial; `extra` (path, value) overrides apply to all of them."""
  config = experiment.config + (",smoke" if smoke else "")
  runs = []
  for trial in experiment.trials:
    workdir = os.path.join(root, experiment.name, trial.name)
    args = (f"--config={config}", f"--workdir={workdir}", *trial.flags,
            *(f"--config.{path}={value}" for path, value in extra))
    runs.append(Run(trial, workdir, args))
  return runs


def finished(run: Run) -> bool:
  """True once the run wrote results.json (local paths or gs:// alike). A remote path
  that cannot be checked from here counts as unfinished: the run itself resumes."""
  try:
    return epath.Path(run.workdir, "results.json").exists()
  except Exception as e:  # No credentials or network for a gs:// root.
    print(f"# cannot check {run.workdir} from here ({type(e).__name__}); "
          "treating it as unfinished", file=sys.stderr)
    return False


def _record(run: Run, experiment: Experiment) -> None:
  os.makedirs(run.workdir, exist_ok=True)
  with open(os.path.join(run.workdir, "trial.json"), "w") as f:
    json.dump({"experiment": experiment.name, "trial": run.trial.name,
               "overrides": {k: format_value(v) for k, v in run.trial.overrides},
               "args": list(run.args)}, f, indent=2)


def _require(tool: str, target: str) -> None:
  if shutil.which(tool) is None:
    raise SystemExit(f"error: --target={target} needs `{tool}` on PATH, and it is not "
                     f"here. Run on a machine that has it, or add --dry_run to see what "
                     f"would be run.")


# --- local -----------------------------------------------------------------------------

def local_commands(run: Run, processes: int = 1) -> list[list[str]]:
  """The command line(s) for one trial; several for a multi-process trial."""
  base = [sys.executable, "-m", "transformer_jax.main", *run.args]
  if processes == 1:
    return [base]
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  return [base + [f"--coordinator_address=localhost:{port}", f"--num_processes={processes}",
                  f"--process_id={i}"] for i in range(processes)]


def launch_local(experiment: Experiment, runs: Sequence[Run], processes: int,
                 dry_run: bool) -> int:
  """Runs the unfinished trials one after another; returns how many failed."""
  failures = 0
  for run in runs:
    if finished(run):
      print(f"# {run.trial.name}: finished, skipped ({run.workdir}/results.json)")
      continue
    commands = local_commands(run, processes)
    for command in commands:
      print(shlex.join(command))
    if dry_run:
      continue
    _record(run, experiment)
    with open(os.path.join(run.workdir, "launch.log"), "a") as log:
      procs = [subprocess.Popen(c, stdout=log if i else None, stderr=log if i else None)
               for i, c in enumerate(commands)]
      codes = [p.wait() for p in procs]
    if any(codes):
      failures += 1
      print(f"# {run.trial.name}: failed (exit codes {codes}); see {run.workdir}",
            file=sys.stderr)
  return failures


# --- SLURM -----------------------------------------------------------------------------

def slurm_script(experiment: Experiment, runs: Sequence[Run], root: str, nodes: int,
                 gpus_per_node: int, partition: str | None, time_limit: str | None,
                 repo_dir: str) -> str:
  """An sbatch array script: array task i runs the i-th unfinished trial, one process
  per GPU; jax.distributed reads its settings from SLURM's environment."""
  lines = ["#!/bin/bash",
           f"#SBATCH --job-name={experiment.name}",
           f"#SBATCH --array=0-{len(runs) - 1}",
           f"#SBATCH --nodes={nodes}",
           f"#SBATCH --ntasks-per-node={gpus_per_node}",
           f"#SBATCH --gpus-per-node={gpus_per_node}",
           f"#SBATCH --output={os.path.join(root, experiment.name, 'slurm-%A_%a.out')}"]
  lines += [f"#SBATCH --partition={partition}"] * bool(partition)
  lines += [f"#SBATCH --time={time_limit}"] * bool(time_limit)
  lines += ["set -euo pipefail", f"cd {shlex.quote(repo_dir)}",
            'case "$SLURM_ARRAY_TASK_ID" in']
  for i, run in enumerate(runs):
    lines.append(f"  {i}) ARGS=({shlex.join(run.args)}) ;;  # {run.trial.name}")
  lines += ["esac",
            'WORKDIR="$(printf "%s\\n" "${ARGS[@]}" | sed -n "s/^--workdir=//p")"',
            '[ -f "$WORKDIR/results.json" ] && { echo "finished: $WORKDIR"; exit 0; }',
            'srun python -m transformer_jax.main "${ARGS[@]}"']
  return "\n".join(lines) + "\n"


def launch_slurm(experiment, runs, root, dry_run, **options) -> str:
  todo = [r for r in runs if not finished(r)]
  if not todo:
    return "# every trial is finished"
  script = slurm_script(experiment, todo, root, **options)
  path = os.path.join(root, experiment.name, "sbatch.sh")
  if dry_run:
    return script + f"# would run: sbatch {path}"
  _require("sbatch", "slurm")
  for run in todo:
    _record(run, experiment)
  with open(path, "w") as f:
    f.write(script)
  result = subprocess.run(["sbatch", path], capture_output=True, text=True)
  if result.returncode:
    raise SystemExit(f"error: sbatch {path} failed: {result.stderr.strip()}")
  return result.stdout.strip()


# --- TPU pods --------------------------------------------------------------------------

def tpu_commands(runs: Sequence[Run], tpu_name: str, zone: str, project: str | None,
                 repo_dir: str) -> list[list[str]]:
  """gcloud commands that run on every worker of the pod: install, then each trial.
  On a pod, --root should be a gs:// bucket that every worker can write."""
  ssh = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", tpu_name, f"--zone={zone}",
         *([f"--project={project}"] if project else []), "--worker=all"]
  # Leave a leading ~/ unquoted so that the worker's shell expands it.
  cd = ("cd ~/" + shlex.quote(repo_dir[2:]) if repo_dir.startswith("~/")
        else "cd " + shlex.quote(repo_dir)) + " && "
  commands = [ssh + ["--command=" + cd + "pip install -e '.[tpu]'"]]
  for run in runs:
    commands.append(ssh + ["--command=" + cd + shlex.join(
        ["python3", "-m", "transformer_jax.main", *run.args])])
  return commands


def launch_tpu(runs, dry_run, **options) -> int:
  todo = [r for r in runs if not finished(r)]
  commands = tpu_commands(todo, **options) if todo else []
  for command in commands:
    print(shlex.join(command))
  if dry_run or not commands:
    return 0
  _require("gcloud", "tpu")
  return sum(subprocess.run(c).returncode != 0 for c in commands)
