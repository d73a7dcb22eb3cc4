"""A stand-in for SLURM's sbatch, srun and scontrol, for rehearsing a multi-node run on
one machine (no real SLURM): `python -m launch ... --target=slurm
--slurm_bin=launch/slurm_standin` (docs/paper.md). Not a scheduler: sbatch runs the job
here and now, then returns.

sbatch runs each array task of the script in turn, as bash, with SLURM's variables; a
"node" is a folder for HOME of its own (FOLDER/standin_homes/nodeN beside the job's
output, never shared, as home folders on a cluster often are not) and 4 simulated CPU
devices (the caller's XLA_FLAGS, with that device count). The batch shell runs on
node 0, its output in the #SBATCH --output file; srun starts one process per task (the
script's --nodes times --ntasks-per-node), task i's output in that file's name with
.nodeN.taskI; scontrol requeue runs the array task again. When the job ends, sbatch
prints its logs, process 0's last, and exits with the job's exit status, naming a
failed task's error line.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys

DEVICES_PER_NODE = 4
# JAX's SLURM cluster takes the coordinator's port from the job id (jax/_src/clusters/
# slurm_cluster.py): SLURM_JOB_ID % 2**12 + FIRST_PORT.
FIRST_PORT = 65535 - 2**12 + 1


def options(script: str) -> dict[str, str]:
  """The script's #SBATCH options: {"--nodes": "2", ...}."""
  with open(script) as f:
    return dict(re.match(r"#SBATCH (--[\w-]+)=?(.*)", line).groups()
                for line in f if line.startswith("#SBATCH --"))


def job_id() -> int:
  """A job id whose coordinator port is free here now."""
  with socket.socket() as s:
    for port in range(FIRST_PORT + os.getpid() % 2**12, 65536):
      try:
        s.bind(("localhost", port))
        return port - FIRST_PORT + 2**12
      except OSError:
        continue
  raise SystemExit("sbatch (stand-in): no free port for the job's coordinator")


def home(output: str, node: int) -> str:
  path = os.path.join(os.path.dirname(output), "standin_homes", f"node{node}")
  os.makedirs(path, exist_ok=True)
  return path


def sbatch(script: str) -> int:
  """Runs every array task of `script` here, one after another."""
  opts, job = options(script), job_id()
  first, last = map(int, opts["--array"].split("%")[0].split("-"))
  tasks = int(opts["--nodes"]) * int(opts["--ntasks-per-node"])
  print(f"Submitted batch job {job}", flush=True)
  worst, shown = 0, []
  for array_task in range(first, last + 1):
    output = opts["--output"].replace("%A", str(job)).replace("%a", str(array_task))
    env = {**os.environ, "SLURM_JOB_ID": str(job), "SLURM_ARRAY_JOB_ID": str(job),
           "SLURM_ARRAY_TASK_ID": str(array_task), "SLURM_NTASKS": str(tasks),
           "SLURM_NNODES": opts["--nodes"], "SLURM_JOB_NUM_NODES": opts["--nodes"],
           "SLURM_NTASKS_PER_NODE": opts["--ntasks-per-node"],
           "SLURM_STANDIN_OUTPUT": output, "SLURM_STANDIN_REQUEUE": output + ".requeue",
           "HOME": home(output, 0)}
    for restart in range(100):
      with open(output, "a") as log:
        code = subprocess.call(["bash", script], stdout=log, stderr=subprocess.STDOUT,
                               env={**env, "SLURM_RESTART_COUNT": str(restart)})
      if not os.path.exists(env["SLURM_STANDIN_REQUEUE"]):
        break
      os.remove(env["SLURM_STANDIN_REQUEUE"])
    logs = [output, *(f"{output}.node{t // int(opts['--ntasks-per-node'])}.task{t}"
                      for t in range(tasks))]
    shown += [logs[0], *reversed(logs[1:])]
    if code:
      worst = worst or code
      print(f"array task {array_task} exited {code}: {first_error(logs)}", file=sys.stderr)
  for log in filter(os.path.exists, shown):
    with open(log) as f:
      print(f"==> {log} <==\n{f.read()}", end="", flush=True)
  return worst


def first_error(logs: list[str]) -> str:
  """The first line starting with "error: " in the logs, in order, or where to look."""
  for log in filter(os.path.exists, logs):
    with open(log) as f:
      for line in f:
        if line.startswith("error: "):
          return f"{line.strip().removeprefix('error: ')} ({log})"
  return f"see {', '.join(logs)}"


def node_xla_flags() -> str:
  """The caller's XLA_FLAGS (a test's compile flags, say) with a node's device count."""
  kept = [flag for flag in os.environ.get("XLA_FLAGS", "").split()
          if not flag.startswith("--xla_force_host_platform_device_count=")]
  return " ".join([*kept, f"--xla_force_host_platform_device_count={DEVICES_PER_NODE}"])


def srun(command: list[str]) -> int:
  """One process per task, each on its node: SLURM's per-task variables, the node's
  HOME and devices; SIGTERM is passed on to every task."""
  tasks, per_node = int(os.environ["SLURM_NTASKS"]), int(os.environ["SLURM_NTASKS_PER_NODE"])
  output = os.environ["SLURM_STANDIN_OUTPUT"]
  procs = []
  for task in range(tasks):
    node = task // per_node
    env = {**os.environ, "SLURM_PROCID": str(task), "SLURM_LOCALID": str(task % per_node),
           "SLURM_NODEID": str(node), "SLURM_STEP_NODELIST": "localhost",
           "SLURM_STEP_NUM_NODES": os.environ["SLURM_NNODES"], "HOME": home(output, node),
           "JAX_PLATFORMS": "cpu", "XLA_FLAGS": node_xla_flags()}
    with open(f"{output}.node{node}.task{task}", "a") as log:
      procs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env))
  signal.signal(signal.SIGTERM, lambda *_: [p.terminate() for p in procs if p.poll() is None])
  codes = [p.wait() for p in procs]
  return next((c for c in codes if c), 0)


def scontrol(args: list[str]) -> int:
  """`scontrol requeue JOB_TASK`: the array task runs again when it exits."""
  if args[:1] != ["requeue"]:
    print(f"scontrol (stand-in): only requeue, not {args}", file=sys.stderr)
    return 1
  open(os.environ["SLURM_STANDIN_REQUEUE"], "w").close()
  return 0


if __name__ == "__main__":
  tool, args = sys.argv[1], sys.argv[2:]
  sys.exit({"sbatch": lambda: sbatch(args[0]), "srun": lambda: srun(args),
            "scontrol": lambda: scontrol(args)}[tool]())
