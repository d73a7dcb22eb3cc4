#!/usr/bin/env python3
"""A stand-in for the `gcloud` commands the TPU launcher runs, on this machine.

State lives in $STANDIN_GCLOUD (a directory): tpus/NAME/{state,home/,pgids,workdir}.
A TPU has one worker, whose disk is tpus/NAME/home (gone when the TPU is deleted); `ssh`
runs the command there in a process group of its own, `scp` copies into it. A TPU is
preempted (its processes killed with SIGKILL, state PREEMPTED) once its run has
checkpointed at or past a step drawn at random, $STANDIN_PREEMPTIONS times per name: a
process started with the run watches its checkpoints. Every call is appended to
$STANDIN_GCLOUD/calls.
"""

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

ZONES = {"us-east5-a": ["v5p-8", "v5p-16", "v5p-64"], "europe-west4-b": ["v6e-8", "v6e-256"]}


def fail(message: str) -> None:
  print(f"ERROR: (gcloud) {message}", file=sys.stderr)
  sys.exit(1)


def kill(tpu: str) -> None:
  """Everything the TPU runs: its ssh commands' process groups and the run's own."""
  pgids, run = os.path.join(tpu, "pgids"), os.path.join(tpu, "home", "transformer_jax_run.pid")
  groups = [g for path in (pgids, run) if os.path.exists(path) for g in open(path).read().split()]
  for pgid in groups:
    try:
      os.killpg(int(pgid), signal.SIGKILL)
    except ProcessLookupError:
      pass


def latest_checkpoint(tpu: str) -> int:
  path = os.path.join(tpu, "workdir")
  if not os.path.exists(path):
    return -1
  checkpoints = os.path.join(open(path).read(), "checkpoints")
  steps = [int(n) for n in os.listdir(checkpoints) if n.isdigit()] \
      if os.path.isdir(checkpoints) else []
  return max(steps, default=-1)


def preempt(root: str, tpu: str, name: str, lost: str) -> None:
  """Preempts the TPU once its run checkpoints at or past a random step in 1..10 (a
  preemption is a SIGKILL of all it runs), if preemptions of this name remain; or, with
  $STANDIN_KILLS, SIGKILLs only the run's process group, as the kernel's OOM killer
  would, leaving the TPU READY and no exit.json."""
  oom = bool(os.environ.get("STANDIN_KILLS"))
  counted = os.path.join(root, f"{'killed' if oom else 'preempted'}.{name}")
  done = int(open(counted).read()) if os.path.exists(counted) else 0
  if done >= int(os.environ.get("STANDIN_KILLS" if oom else "STANDIN_PREEMPTIONS", "0")):
    return
  target, deadline = random.randint(1, 10), time.time() + 600
  while os.path.isdir(tpu) and time.time() < deadline:
    if latest_checkpoint(tpu) >= target:
      if oom:
        os.killpg(int(open(os.path.join(tpu, "home", "transformer_jax_run.pid")).read()),
                  signal.SIGKILL)
      else:
        kill(tpu)
        open(os.path.join(tpu, "state"), "w").write(lost)
      open(counted, "w").write(str(done + 1))
      return
    time.sleep(0.05)


def main(args: list[str]) -> None:
  root = os.environ["STANDIN_GCLOUD"]
  if args[0] == "preempt":
    return preempt(root, *args[1:])
  with open(os.path.join(root, "calls"), "a") as f:
    f.write(" ".join(args) + "\n")
  options = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
  words = [a for a in args if not a.startswith("--")]
  if words[:2] == ["auth", "list"]:
    if not os.path.exists(os.path.join(root, "logged_out")):
      print("someone@example.com")
    return
  if options.get("zone") not in ZONES:
    fail(f"INVALID_ARGUMENT: zone {options.get('zone')!r} is not a zone.")
  if words[2:4] == ["accelerator-types", "list"]:
    print("\n".join(ZONES[options["zone"]]))
    return
  kind, verb = words[2], words[3]  # compute tpus KIND VERB ...
  name = words[5].split(":")[0] if verb == "scp" else words[4]
  ready, lost = ("ACTIVE", "SUSPENDED") if kind == "queued-resources" else ("READY", "PREEMPTED")
  tpu = os.path.join(root, "tpus", name)
  exists = os.path.isdir(tpu)
  if verb == "create":
    if exists:
      fail(f"ALREADY_EXISTS: {name}")
    if options["accelerator-type"] not in ZONES[options["zone"]]:
      fail(f"INVALID_ARGUMENT: {options['accelerator-type']} in {options['zone']}")
    os.makedirs(os.path.join(tpu, "home"))
    open(os.path.join(tpu, "state"), "w").write(ready)
    return
  if not exists:
    fail(f"NOT_FOUND: Resource 'projects/p/locations/z/nodes/{name}' was not found")
  if verb == "delete":
    kill(tpu)
    shutil.rmtree(tpu)
  elif verb == "describe":
    print(open(os.path.join(tpu, "state")).read())
  elif verb == "scp":
    shutil.copy(words[4], os.path.join(tpu, "home", words[5].split(":", 1)[1]))
  elif verb == "ssh":
    command = options["command"]
    workdir = re.search(r"--workdir=(\S+)", command)
    if workdir:
      open(os.path.join(tpu, "workdir"), "w").write(workdir.group(1))
      preemptor = [sys.executable, __file__, "preempt", tpu, name, lost]
      subprocess.Popen(preemptor, start_new_session=True, stdout=subprocess.DEVNULL)
    home = os.path.join(tpu, "home")
    proc = subprocess.Popen(["bash", "-c", command], cwd=home, start_new_session=True,
                            env={**os.environ, "HOME": home})
    with open(os.path.join(tpu, "pgids"), "a") as f:
      f.write(f"{proc.pid}\n")
    sys.exit(proc.wait())


if __name__ == "__main__":
  main(sys.argv[1:])
