"""The SLURM target: an experiment's trials as one sbatch array job, one task per
unfinished trial, one process per GPU, from the code shipped to the shared filesystem
(ROOT/EXPERIMENT/code/FINGERPRINT); a search as an array job of launchers that share its
study. SLURM itself watches them: each task requeues itself after checkpointing at the
time limit, and SLURM requeues a preempted one (--requeue).
"""

from __future__ import annotations

import os
import shlex
import subprocess
from typing import Sequence

from absl import flags
from etils import epath

from launch import pack as pack_lib, search as search_lib, study as study_lib, sweep
from launch import trials as trials_lib
from launch.targets import TARGETS, Target
from transformer_jax import cli, files


@TARGETS.register("slurm")
class Slurm(Target):
  """Submits with sbatch; --slurm_bin names another folder of SLURM's commands."""

  study_journal = True  # Many nodes append to a search's study.

  @staticmethod
  def define_flags() -> None:
    flags.DEFINE_integer("nodes", 1, "slurm: nodes per trial.")
    flags.DEFINE_integer("gpus_per_node", 8, "slurm: GPUs per node (one process each).")
    flags.DEFINE_string("partition", None, "slurm: partition.")
    flags.DEFINE_string("time", None, "slurm: time limit, e.g. 48:00:00.")
    flags.DEFINE_string("account", None, "slurm: the account to charge.")
    flags.DEFINE_string("qos", None, "slurm: quality of service.")
    flags.DEFINE_string("mem", None, "slurm: memory per node, e.g. 400G (0: all of it).")
    flags.DEFINE_integer("cpus_per_task", None, "slurm: CPU cores per task (per GPU).")
    flags.DEFINE_multi_string("sbatch", [], "slurm: any other sbatch option, as it follows "
                              "#SBATCH, e.g. --sbatch=--exclusive; repeatable.")
    flags.DEFINE_integer("max_running", 0, "slurm: at most this many trials at once (the "
                         "array's %N throttle); 0: as many as SLURM allows.")
    flags.DEFINE_string("slurm_bin", None, "slurm: a folder of SLURM's commands (sbatch, "
                        "srun, scontrol) to use before those on PATH; launch/slurm_standin "
                        "is a stand-in that runs the job on this machine, its nodes "
                        "simulated (a rehearsal: docs/paper.md).")
    flags.DEFINE_string("activate", None, "slurm: shell line that activates the Python "
                        "environment on the nodes, e.g. 'source ~/venv/bin/activate'.")

  def __init__(self, flags):
    super().__init__(flags)
    if flags.slurm_bin:  # For sbatch, and for the job it submits (its PATH is this one).
      if not os.path.isdir(flags.slurm_bin):
        cli.fail(f"--slurm_bin={flags.slurm_bin}: no such folder (one that holds sbatch, "
                 "srun and scontrol).")
      os.environ["PATH"] = os.path.abspath(flags.slurm_bin) + os.pathsep + os.environ["PATH"]

  def hosts(self) -> int:
    return self.flags.nodes

  def processes(self) -> int:
    return self.flags.nodes * self.flags.gpus_per_node

  def sbatch_options(self) -> list[str]:
    """The #SBATCH options the flags name, then --sbatch's."""
    f = self.flags
    named = {"partition": f.partition, "time": f.time, "account": f.account, "qos": f.qos,
             "mem": f.mem, "cpus-per-task": f.cpus_per_task}
    return [f"--{k}={v}" for k, v in named.items() if v is not None] + f.sbatch

  def launch(self, experiment: sweep.Experiment, runs: Sequence[trials_lib.Run]) -> int:
    """Unpacks the code beside the runs (EXPERIMENT/code/FINGERPRINT) and submits the
    unfinished trials as one array job."""
    f = self.flags
    code = self.shipped_code("sbatch")
    self.check_shipped(runs, code)
    todo = self.unfinished(runs)
    if todo:
      if code:
        self._check_shared_root("the code is unpacked there")
      folder = epath.Path(todo[0].workdir).parent
      code_dir = code_folder(folder, code, f.repo_dir)
      script = array_script(experiment, todo, nodes=f.nodes, gpus_per_node=f.gpus_per_node,
                            code_dir=code_dir, activate=f.activate,
                            sbatch=self.sbatch_options(), max_running=f.max_running,
                            prepare=self.prepare())
      if not f.dry_run:
        for run in todo:
          trials_lib.record(run, experiment, self.code_record(code))
      print(submit(script, folder, code, code_dir, f.dry_run))
    if f.dry_run:
      self.print_costs(runs, f.cost_on or f"{f.nodes * f.gpus_per_node}xH100")
    return 0

  def check_search(self) -> None:
    if self.flags.nodes != 1:
      cli.fail(f"--nodes={self.flags.nodes}: a search sizes its trials by its SEARCH's "
               "trial_devices (e.g. trial_devices=16 with --gpus_per_node=8: 2 nodes a "
               "trial; 1: 8 trials share a node)")
    self._check_shared_root("each trial's checkpoints are written there")

  def _check_shared_root(self, why: str) -> None:
    if files.is_remote(self.flags.root):
      cli.fail(f"--root={self.flags.root}: SLURM runs need a shared filesystem path that "
               f"every node mounts ({why}), not a bucket.")

  def search(self, experiment: sweep.Experiment, extra, storage: str) -> int:
    """Submits the search's array job: tasks that run the local target, sized by the
    search's trial_devices (search_script). A storage URL's password never reaches the
    job (SLURM stores a job's environment): its tasks read it from ~/.pgpass
    ($PGPASSFILE), which must be here."""
    f = self.flags
    pgpass = os.environ.get("PGPASSFILE", os.path.expanduser("~/.pgpass"))
    if (study_lib.password_of(storage) or os.environ.get("PGPASSWORD")) and \
        not os.path.exists(pgpass):
      cli.fail("the study's password cannot travel to the SLURM tasks (SLURM stores a "
               f"job's environment), and there is no {pgpass} for them to read it from: "
               "put it there (HOST:PORT:DATABASE:USER:PASSWORD, chmod 600)")
    code = self.shipped_code("sbatch")
    root = os.path.abspath(f.root)
    folder = trials_lib.experiment_dir(experiment, root, f.smoke)
    code_dir = code_folder(folder, code, f.repo_dir)
    script = search_script(experiment, root, storage, extra, f.smoke, code_dir,
                           gpus_per_node=f.gpus_per_node, activate=f.activate,
                           sbatch=self.sbatch_options(), max_running=f.max_running)
    print(search_lib.describe(experiment) + "\n"
          + submit(script, folder, code, code_dir, f.dry_run))
    return 0


def array_script(experiment: sweep.Experiment, runs: Sequence[trials_lib.Run], nodes: int,
                 gpus_per_node: int, code_dir: str, activate: str | None,
                 sbatch: Sequence[str] = (), max_running: int = 0,
                 prepare: bool = True) -> str:
  """An sbatch array script: array task i runs the i-th unfinished trial, one process
  per GPU, with the code in `code_dir` (the unpacked pack, on the shared filesystem)
  after the `activate` shell line; jax.distributed reads its settings from SLURM.
  `sbatch`: more sbatch options (--partition=..., --account=...); `max_running`: at most
  this many array tasks at once (0: no limit). With `prepare`, the batch shell (on the
  first node) prepares the trial's data first, in one process on the CPU, so that the
  processes srun starts build nothing.

  A long run spans many allocations: SLURM signals the batch shell 5 minutes before the
  time limit (--signal=B:USR1@300); the trap passes SIGTERM to the run, which
  checkpoints and exits 75, and the task requeues itself. A preempted task gets SIGTERM
  from SLURM and is requeued by it (--requeue). The next allocation, on as many nodes
  as SLURM gives it, resumes with the same code.
  """
  lines = sbatch_header(experiment.name, len(runs), nodes, gpus_per_node, gpus_per_node,
                        epath.Path(runs[0].workdir).parent, sbatch, max_running)
  lines += ["set -euo pipefail", *[activate] * bool(activate),
            f"cd {shlex.quote(code_dir)}", "export PYTHONPATH=\"$PWD\"",
            'case "$SLURM_ARRAY_TASK_ID" in']
  for i, run in enumerate(runs):
    lines.append(f"  {i}) ARGS=({shlex.join(run.args)}) ;;  # {run.trial.name}")
  lines += ["esac",
            'WORKDIR="$(printf "%s\\n" "${ARGS[@]}" | sed -n "s/^--workdir=//p")"',
            '[ -f "$WORKDIR/results.json" ] && { echo "finished: $WORKDIR"; exit 0; }',
            *['JAX_PLATFORMS=cpu python -m transformer_jax.main "${ARGS[@]}" --prepare_data'
              ] * prepare,
            *run_and_requeue('srun python -m transformer_jax.main "${ARGS[@]}"')]
  return "\n".join(lines) + "\n"


def sbatch_header(name: str, tasks: int, nodes: int, tasks_per_node: int, gpus_per_node: int,
                  folder: epath.Path, sbatch: Sequence[str], max_running: int) -> list[str]:
  """An array job's #SBATCH lines: `tasks` array tasks (at most `max_running` at once;
  0: no limit), output appended to FOLDER/slurm-JOB_TASK.out, requeued after a
  preemption, signalled 5 minutes before the time limit; then `sbatch` options."""
  return ["#!/bin/bash", f"#SBATCH --job-name={name}",
          f"#SBATCH --array=0-{tasks - 1}" + f"%{max_running}" * bool(max_running),
          f"#SBATCH --nodes={nodes}", f"#SBATCH --ntasks-per-node={tasks_per_node}",
          f"#SBATCH --gpus-per-node={gpus_per_node}",
          f"#SBATCH --output={folder / 'slurm-%A_%a.out'}",
          "#SBATCH --open-mode=append", "#SBATCH --requeue", "#SBATCH --signal=B:USR1@300",
          *(f"#SBATCH {option}" for option in sbatch)]


def run_and_requeue(*commands: str) -> list[str]:
  """Shell lines that run `commands` at once so that SLURM's USR1 reaches each as
  SIGTERM, and requeue the task when one exits 75 (checkpointed)."""
  return ["RUNS=()", "trap 'kill -TERM \"${RUNS[@]}\" 2>/dev/null' USR1",
          *(f"{command} & RUNS+=($!)" for command in commands),
          'CODE=0',
          'for RUN in "${RUNS[@]}"; do',
          # The trap interrupts `wait`; wait again until the run has really exited.
          '  while kill -0 "$RUN" 2>/dev/null; do wait "$RUN" || true; done',
          '  ONE=0; wait "$RUN" || ONE=$?',
          # A checkpointed run requeues the task; else the first failure is its exit code.
          f'  if [ "$ONE" -eq {cli.EXIT_PREEMPTED} ] || [ "$CODE" -eq 0 ]; then CODE=$ONE; fi',
          'done',
          f'if [ "$CODE" -eq {cli.EXIT_PREEMPTED} ]; then',
          '  echo "checkpointed before the time limit or preemption: requeueing"',
          '  scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"',
          'fi',
          'exit "$CODE"']


def code_folder(folder: epath.Path, pack, repo_dir: str | None) -> str:
  """Where an array job's tasks run the code: the shipped pack, unpacked beside the
  runs (FOLDER/code/FINGERPRINT), or --repo_dir."""
  return str(folder / "code" / pack.fingerprint) if pack else repo_dir


def submit(script: str, folder: epath.Path, pack, code_dir: str, dry_run: bool) -> str:
  """Unpacks the code into `code_dir` (if shipped), writes FOLDER/sbatch.sh and submits
  it (sbatch in this environment, passed on to the tasks and stored by SLURM, without
  the study's password); a dry run says what it would do."""
  path = str(folder / "sbatch.sh")
  if dry_run:
    return script + (f"# would unpack the code ({len(pack.files)} files) into {code_dir}\n"
                     if pack else "") + f"# would run: sbatch {path}"
  if pack:
    pack_lib.unpack(pack, code_dir)
  files.write_atomic(path, script)
  result = subprocess.run(["sbatch", path], capture_output=True, text=True,
                          env=study_lib.without_secrets(os.environ))
  if result.returncode:  # (A stand-in that runs the job says the job's error.)
    cli.fail(f"sbatch {path} failed: {result.stderr.strip()}", result.returncode)
  return result.stdout.strip()


def search_script(experiment: sweep.Experiment, root: str, storage: str, extra, smoke: bool,
                  code_dir: str, gpus_per_node: int, activate: str | None,
                  sbatch: Sequence[str] = (), max_running: int = 0) -> str:
  """An sbatch array job for a search, its tasks sized by the search's trial_devices
  (Search.placement on nodes of `gpus_per_node`): a trial on a node's GPUs, one task a
  trial of the budget; a trial on several nodes, each task that many nodes, its launcher
  starting the trial's processes with srun (one per GPU, one JAX run); several trials
  a node, each task one node, with a launcher per trial sharing it, each given its
  own GPUs (CUDA_VISIBLE_DEVICES). A launcher (--target=local) takes trials from the
  shared study until the budget is spent, from the code in `code_dir`; at most
  `max_running` tasks at once. At the time limit or a preemption the task's trials
  checkpoint and the task requeues itself; the next allocation's launchers resume
  them (at once on the same node, else once the old heartbeats stand still)."""
  path = os.path.relpath(os.path.abspath(experiment.path))
  if path.startswith(".."):
    cli.fail(f"--experiment={experiment.path}: a search on SLURM runs the experiment file "
             "from the shipped code: put it inside this working tree")
  try:
    nodes, per_node = experiment.search.placement(gpus_per_node)
  except ValueError as e:
    cli.fail(f"{experiment.path}: SEARCH {e} (--gpus_per_node={gpus_per_node})")
  command = shlex.join(["python", "-m", "launch", f"--experiment={path}", f"--root={root}",
                        f"--storage={study_lib.without_password(storage)}", "--target=local",
                        *["--srun"] * (nodes > 1), *["--smoke"] * smoke,
                        *(f"--set={p}={v}" for p, v in extra)])
  folder = trials_lib.experiment_dir(experiment, root, smoke)
  tasks = -(-experiment.search.trials // per_node)
  lines = sbatch_header(experiment.name, tasks, nodes, gpus_per_node if nodes > 1 else 1,
                        gpus_per_node, folder, sbatch, max_running)
  lines += ["set -euo pipefail", *[activate] * bool(activate),
            f"cd {shlex.quote(code_dir)}", "export PYTHONPATH=\"$PWD\""]
  if per_node == 1:
    return "\n".join([*lines, *run_and_requeue(command)]) + "\n"
  size = gpus_per_node // per_node  # Each launcher's GPUs, from SLURM's for the node.
  lines += [f"# {per_node} trials at once on this node, {size} GPU(s) each",
            f'GPUS="${{CUDA_VISIBLE_DEVICES:-{",".join(map(str, range(gpus_per_node)))}}}"']
  return "\n".join([*lines, *run_and_requeue(*(
      f'CUDA_VISIBLE_DEVICES="$(cut -d, -f{i * size + 1}-{i * size + size} <<< "$GPUS")" '
      + command for i in range(per_node)))]) + "\n"
