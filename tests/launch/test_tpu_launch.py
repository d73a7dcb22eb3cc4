"""Trials on TPUs the launcher creates, watches, recreates after preemptions and deletes,
against a stand-in `gcloud` (tests/launch/standin_gcloud.py) whose TPUs are process groups on
this machine. The bucket is a directory outside every TPU's disk, which a recreated TPU
starts without."""

import importlib.util
import json
import os
import re
import shlex
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

from conftest import COMPARABLE_RUNS, ROOT, ROUNDING_CONTROL, assert_within_rounding
from conftest import checkpoint_state, max_relative_difference, outputs_of
from conftest import copy_task_files, start_training, xla_flags
from launch import pack as pack_lib, tpu_vm
from transformer_jax import distributed

SETTINGS = [*(f.replace("--config.", "--set=") for f in COMPARABLE_RUNS),
            "--set=train.checkpoint_every_steps=5", "--set=train.eval_every_steps=10",
            "--set=decode.beam_size=1", "--set=data.num_eval_examples=8",
            "--set=train.max_length_buckets=1"]  # One train step to compile a trial.


@pytest.fixture
def cloud(tmp_path):
  """PATH with the stand-in gcloud and a worker as tpu-ubuntu2204-base comes: its python3
  is 3.10, so the launcher gets a Python 3.11 virtualenv from uv. The stand-in uv makes
  one whose python is this Python, and pip installs nothing (the workers use this
  virtualenv's packages). Returns (env, state directory)."""
  bin_dir, state = tmp_path / "bin", tmp_path / "gcloud"
  bin_dir.mkdir()
  state.mkdir()
  venv_python = f'#!/bin/bash\nexec {sys.executable} "$@"'
  uv = (f'venv="${{@: -1}}"; mkdir -p "$venv/bin"\n'  # uv venv ... .venv
        f"printf '%s\\n' {shlex.quote(venv_python)} > \"$venv/bin/python\"\n"
        'printf "#!/bin/bash\\necho pip: nothing to install here\\n" > "$venv/bin/pip"\n'
        'chmod +x "$venv/bin/python" "$venv/bin/pip"')
  for name, body in (("gcloud", f"exec {sys.executable} {ROOT}/tests/launch/standin_gcloud.py"
                               ' "$@"'),
                     ("uv_standin", uv),
                     ("pip", f'[ "$*" = "install -q --user uv" ] && mkdir -p ~/.local/bin && '
                             f'cp {bin_dir}/uv_standin ~/.local/bin/uv; '
                             'echo "pip $*: nothing more to install here"'),
                     ("python3", '[ "$1" = -c ] && [[ "$2" == *version_info* ]] && exit 1; '
                                 'echo "python3 is Python 3.10 here" >&2; exit 1')):
    (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
    (bin_dir / name).chmod(0o755)
  env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STANDIN_GCLOUD": str(state),
         "XLA_FLAGS": xla_flags(1), "JAX_PLATFORMS": "cpu"}
  return env, state


def _experiment(tmp_path, seeds):
  path = tmp_path / "seeds.py"
  path.write_text('"""Seeds on the numbers task."""\nfrom launch import sweep\n'
                  'CONFIG = "configs/transformer.py:numbers"\n'
                  f'def trials():\n  return sweep.grid({{"train.seed": {seeds}}})\n')
  return path


def _launch(env, *flags, timeout=400):
  """The TPU launcher against the stand-in gcloud (its fit check, which compiles each
  trial for the TPU here, is tested in test_topology.py)."""
  return subprocess.run([sys.executable, "-m", "launch", "--target=tpu", "--tpu_name=t",
                         "--zone=us-east5-a", "--skip_fit_check", *flags], cwd=ROOT,
                        env=env, text=True, capture_output=True, timeout=timeout)


@pytest.mark.slow
def test_preempted_spot_tpus_are_recreated_until_every_trial_is_done(tmp_path, cloud):
  """3 trials, 2 at a time, each TPU preempted once (SIGKILL, after a checkpoint at a
  random step); every trial finishes, no TPU is left, and a preempted trial's final
  parameters equal an uninterrupted run's."""
  env, state = cloud
  env["STANDIN_PREEMPTIONS"] = "1"
  root = tmp_path / "bucket"
  out = _launch(env, f"--experiment={_experiment(tmp_path, [0, 1, 2])}", f"--root={root}",
                "--smoke", "--accelerator_type=v5p-8", "--spot", "--parallel=2",
                "--poll_s=0.5", *SETTINGS)
  calls = (state / "calls").read_text()
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:] + calls[-3000:]
  events = (root / "seeds_smoke" / "tpu_events.log").read_text()
  for i, name in enumerate(("seed=0", "seed=1", "seed=2")):
    assert (root / "seeds_smoke" / name / "results.json").exists(), events
    assert f"{name} on t-{i}: PREEMPTED" in events and (state / f"preempted.t-{i}").exists()
  assert not list((state / "tpus").iterdir()), events  # Every TPU deleted.

  alive, most = set(), 0  # TPUs alive at once, from the order of the calls.
  for call in calls.splitlines():
    words = call.split()
    if words[3] in ("create", "delete"):
      (alive.add if words[3] == "create" else alive.discard)(words[4])
      most = max(most, len(alive))
  assert most == 2, calls

  code = pack_lib.describe(ROOT)["fingerprint"]
  trial = json.loads((root / "seeds_smoke" / "seed=0" / "trial.json").read_text())
  assert trial["code"]["fingerprint"] == code
  args = [a for a in trial["args"] if not a.startswith("--workdir")]
  whole, control = tmp_path / "uninterrupted", tmp_path / "control"
  procs = [*start_training(whole, args), *start_training(control, [*args, ROUNDING_CONTROL])]
  logs = outputs_of(procs)
  for proc, log in zip(procs, logs):
    assert proc.returncode == 0, log[-3000:]
  assert f"code {code} from" in logs[0]
  params = lambda run: checkpoint_state(run, 20)["params"]
  preempted = root / "seeds_smoke" / "seed=0"
  assert_within_rounding(
      {"params": max_relative_difference(params(preempted), params(whole))},
      {"params": max_relative_difference(params(control), params(whole))})


@pytest.mark.slow
def test_a_run_killed_on_a_ready_tpu_is_noticed_and_started_again(tmp_path, cloud):
  """The run's process group is SIGKILLed (as by the OOM killer) after a checkpoint,
  leaving no exit.json and the TPU READY: the launcher's next look finds the run gone,
  logs its last lines, counts it against --max_failures and starts it again; the trial
  finishes."""
  env, state = cloud
  env["STANDIN_KILLS"] = "1"
  root = tmp_path / "bucket"
  out = _launch(env, f"--experiment={_experiment(tmp_path, [0])}", f"--root={root}",
                "--smoke", "--accelerator_type=v5p-8", "--poll_s=0.5", *SETTINGS)
  events = (root / "seeds_smoke" / "tpu_events.log").read_text()
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert (state / "killed.t-0").exists() and "PREEMPTED" not in events
  assert "seed=0 on t-0: the run died without exit.json" in events, events
  assert "its log ends:" in events and "1 of 5 allowed" in events
  assert (root / "seeds_smoke" / "seed=0" / "results.json").exists()


@pytest.mark.slow
def test_the_workers_logs_reach_the_bucket_before_the_tpu_goes_and_results_show_the_last_line(
    tmp_path, cloud):
  """A trial with a test split: once its results.json is in the bucket, each worker's
  log (its last LOG_LINES lines) is copied into WORKDIR/logs before the TPU is deleted,
  and `launch.results` prints the run's last line, its test scores, from there."""
  env, state = cloud
  data = copy_task_files(tmp_path, {"train": 400, "eval": 8, "test": 8})
  root, experiment = tmp_path / "bucket", _experiment(tmp_path, [0])
  out = _launch(env, f"--experiment={experiment}", f"--root={root}", "--smoke",
                "--accelerator_type=v5p-8", "--poll_s=0.5", *SETTINGS, "--set=data.task=text",
                *(f"--set=data.{split}_files={data[split]}" for split in data),
                "--set=data.vocab_size=64")
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  workdir = root / "seeds_smoke" / "seed=0"
  logs = sorted((workdir / "logs").iterdir())
  assert [p.name for p in logs] == [f"seed=0.{socket.gethostname()}.log"]
  lines = logs[0].read_text().splitlines()
  assert lines[-1].startswith("Test test.src (8 sentences; ") and len(lines) <= tpu_vm.LOG_LINES
  calls = (state / "calls").read_text().splitlines()
  copied = max(i for i, c in enumerate(calls) if "ssh" in c and "files.write_atomic" in c)
  assert copied < next(i for i, c in enumerate(calls) if "tpu-vm delete t-0" in c), calls
  events = (root / "seeds_smoke" / "tpu_events.log").read_text()
  assert f"the workers' logs in {workdir / 'logs'}; TPU deleted" in events, events
  table = subprocess.run([sys.executable, "-m", "launch.results", f"--experiment={experiment}",
                          f"--root={root}", "--smoke"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
  assert table.returncode == 0 and f"seed=0: {lines[-1]}\n" in table.stdout, table.stdout

@pytest.mark.parametrize("flags, logged_out, message", [
    (["--zone=us-east5-z", "--accelerator_type=v5p-8"], False,
     "error: --zone=us-east5-z: gcloud cannot list its TPU types: ERROR: (gcloud) "
     "INVALID_ARGUMENT: zone 'us-east5-z' is not a zone."),
    (["--zone=us-east5-a", "--accelerator_type=v5p-6"], False,
     "error: --accelerator_type=v5p-6 is not offered in us-east5-a; did you mean v5p-64 or "
     "v5p-16 or v5p-8?"),
    (["--zone=us-east5-a", "--accelerator_type=v5p-8"], True,
     "error: gcloud has no active account: run `gcloud auth login`")])
def test_bad_zones_types_and_logins_stop_the_launch_in_one_line(tmp_path, cloud, flags,
                                                               logged_out, message):
  env, state = cloud
  if logged_out:
    (state / "logged_out").touch()
  out = _launch(env, "--experiment=experiments/big_reproduction.py", f"--root={tmp_path}/r",
                *flags)
  assert out.returncode == 2 and out.stderr.startswith(message), out.stderr
  assert len(out.stderr.splitlines()) == 1 and not (state / "tpus").exists()


def test_a_bucket_without_credentials_is_refused_in_one_line_touching_nothing(tmp_path,
                                                                          cloud):
  """No application-default credentials here (`gcloud auth login` gives none): a launch
  with a gs:// root and a run with a gs:// workdir each stop in one line that says how
  to get them (as every command does: cli.parse_flags), before any gcloud command (a
  trial's TPU already up is left as it is). A dry run reads no bucket and goes on."""
  env, state = cloud
  env = {k: v for k, v in env.items()
         if k not in ("GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG")}
  env.update(HOME=str(tmp_path), NO_GCE_CHECK="true")  # Not a Google Cloud VM, either.
  running = state / "tpus" / "t-0"
  running.mkdir(parents=True)
  (running / "state").write_text("READY")
  experiment = "--experiment=experiments/big_reproduction.py"
  commands = {
      "launch": ["launch", "--target=tpu", "--tpu_name=t", "--zone=us-east5-a",
                 "--accelerator_type=v5p-8", "--skip_fit_check", experiment],
      "transformer_jax.main": ["transformer_jax.main", "--config=configs/transformer.py:numbers"]}
  for module, flags in commands.items():
    flag = "--workdir=gs://bucket/runs/big" if module.endswith("main") else "--root=gs://bucket/runs"
    out = subprocess.run([sys.executable, "-m", *flags, flag], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, (module, out.stderr)
    assert out.stderr.startswith(f"error: {flag}: no application-default credentials") and (
        "`gcloud auth application-default login`" in out.stderr), out.stderr
  assert not (state / "calls").exists() and (running / "state").read_text() == "READY"
  dry = _launch(env, experiment, "--root=gs://bucket/runs", "--accelerator_type=v5p-8",
                "--dry_run")
  assert dry.returncode == 0 and "tpu-vm create t-0 " in dry.stdout, dry.stderr[-2000:]

def test_a_multi_host_slice_with_a_local_root_is_refused_in_one_line(tmp_path, cloud):
  env, state = cloud
  out = _launch(env, "--experiment=experiments/big_reproduction.py", f"--root={tmp_path}/r",
                "--accelerator_type=v5p-64", "--dry_run")
  assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
  assert "a v5p-64 has 8 hosts" in out.stderr and "--root=gs://BUCKET/runs" in out.stderr


def _git_clone(tmp_path):
  """A copy of this repository's tracked files, committed in a git clone of its own."""
  clone = tmp_path / "clone"
  subprocess.run(["git", "clone", "-q", ROOT, str(clone)], check=True)
  return clone


def test_the_pack_carries_code_only(tmp_path):
  clone = _git_clone(tmp_path)
  (clone / "transformer_jax" / "new.py").write_text("X = 1\n")  # Untracked code ships.
  with open(clone / "README.md", "a") as f:
    f.write("A local change.\n")
  pack = pack_lib.make(str(clone))
  assert "transformer_jax/new.py" in pack.files and "+A local change." in pack.diff
  assert "+++ b/transformer_jax/new.py" in pack.diff
  assert pack_lib.describe(str(clone)) == pack.record()  # Local launches record the same.
  assert pack.revision == subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"],
                                         capture_output=True, text=True).stdout.strip()
  unpacked = tmp_path / "unpacked"
  pack_lib.unpack(pack, str(unpacked))
  assert distributed.code_fingerprint(str(unpacked)) == pack.fingerprint
  (clone / "corpus.txt").write_bytes(b"x" * (pack_lib.MAX_FILE_BYTES + 1))
  with pytest.raises(pack_lib.PackError, match=r"corpus.txt is 1.0 MB and not in git"):
    pack_lib.make(str(clone))
  (clone / "corpus.txt").unlink()
  with pytest.raises(pack_lib.PackError, match=r"the code pack .* is 0.\d MB, over the 0 MB"):
    pack_lib.make(str(clone), max_bytes=1000)


def test_a_trial_launched_with_other_code_is_not_resumed_unless_asked(tmp_path, cloud):
  env, state = cloud
  flags = ["--experiment=experiments/base_reproduction.py", f"--root={tmp_path}/r",
           "--zone=us-east5-a", "--accelerator_type=v5p-8", "--max_failures=1"]
  trial = tmp_path / "r" / "base_reproduction" / "base" / "trial.json"
  trial.parent.mkdir(parents=True)
  trial.write_text('{"code": {"fingerprint": "0123456789ab"}}')
  out = _launch(env, *flags)
  assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
  assert out.stderr.startswith("error: the code changed since these trials were launched: "
                               "base (was 0123456789ab)")
  assert "--allow_code_change" in out.stderr and not (state / "tpus").exists()


@pytest.mark.slow
def test_ctrl_c_stops_the_watching_only_and_a_second_launch_takes_over(tmp_path, cloud):
  """Ctrl-C once the run started: the TPU and its run go on. The same command again
  finds the run going on the queued resource, starts nothing new, and deletes the TPU
  once results.json exists."""
  env, state = cloud
  flags = [f"--experiment={_experiment(tmp_path, [0])}", f"--root={tmp_path}/bucket",
           "--smoke", "--accelerator_type=v5p-8", "--queued_resource", "--poll_s=0.5",
           *SETTINGS]
  # `python -m launch`, with Ctrl-C's KeyboardInterrupt even when this suite runs under
  # a shell's `&` (which starts it with SIGINT ignored, and children inherit that).
  as_from_a_terminal = ("import runpy, signal; signal.signal(signal.SIGINT, "
                        "signal.default_int_handler); runpy.run_module('launch', "
                        "run_name='__main__', alter_sys=True)")
  watcher = subprocess.Popen([sys.executable, "-c", as_from_a_terminal, "--target=tpu",
                              "--tpu_name=t", "--zone=us-east5-a", *flags], cwd=ROOT,
                             env=env, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
  for line in watcher.stdout:
    if "run started" in line:
      watcher.send_signal(signal.SIGINT)
      break
  rest = watcher.communicate(timeout=60)[0]
  assert watcher.returncode == 130 and "stopped watching (Ctrl-C)" in rest, rest
  assert (state / "tpus" / "t-0").exists()
  # The run is held still (SIGSTOP: alive, not going on) until the second launch has
  # seen it, so that no machine's speed decides whether it ended before that look.
  run_pid = state / "tpus" / "t-0" / "home" / "transformer_jax_run.pid"
  deadline = time.time() + 60
  while not run_pid.exists() and time.time() < deadline:
    time.sleep(0.1)
  group = int(run_pid.read_text())
  os.killpg(group, signal.SIGSTOP)
  release = threading.Timer(120, os.killpg, (group, signal.SIGCONT))  # Never held forever.
  release.start()
  second = subprocess.Popen([sys.executable, "-m", "launch", "--target=tpu", "--tpu_name=t",
                             "--zone=us-east5-a", "--skip_fit_check", *flags], cwd=ROOT,
                            env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
  seen = []
  for line in second.stdout:
    seen.append(line)
    if "; its run was already going" in line:
      break
  os.killpg(group, signal.SIGCONT)
  release.cancel()
  seen.append(second.communicate(timeout=400)[0])
  out = "".join(seen)
  assert second.returncode == 0, out[-3000:]
  assert "seed=0 on t-0: code " in out and "; its run was already going" in out, out
  assert (tmp_path / "bucket" / "seeds_smoke" / "seed=0" / "results.json").exists()
  assert not (state / "tpus" / "t-0").exists()
  assert "queued-resources create t-0 --node-id=t-0" in (state / "calls").read_text()


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="libtpu is not installed")
def test_the_readmes_tpu_dry_run_reads_no_bucket_and_says_what_it_checks(tmp_path):
  """With --root=gs://... and no network, a dry run reads nothing from the bucket (no
  credentials asked, no retries), says so, and prints each trial's fit check as it goes."""
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  out = subprocess.run(
      [sys.executable, "-m", "launch", "--experiment=experiments/big_reproduction.py",
       "--target=tpu", "--tpu_name=big", "--zone=us-east5-a", "--accelerator_type=v5p-8",
       "--spot", "--root=gs://bucket/runs", "--dry_run", "--smoke"], cwd=ROOT, env=env,
      capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  lines = out.stdout.splitlines()
  assert lines[1].startswith("# dry run: gs://bucket/runs is not read"), lines
  checking = lines.index("# big: compiling for v5p-8 ...")
  assert lines[checking - 1].startswith("# checking that each trial fits v5p-8")
  assert lines[checking + 1].startswith("# big: fits v5p-8"), lines
  estimate, ms = re.search(r"estimated \((\w+)\) ([\d.]+) ms a step",
                           lines[checking + 1]).groups()
  assert lines[checking + 2].startswith("# big: cost on v5p-8 (4 chips, 1 host(s)): ")
  training = lines[checking + 3]  # The cost's training part rests on that estimate.
  assert training.startswith("#   training: ") and "; estimated: 20 steps x " in training
  assert (f"the {estimate}'s estimate a position of the longest batch" in training and
          f", {float(ms):.1f} ms) compiled here for v5p-8" in training), training
  for noise in ("cannot check", "google_auth", "credentials", "Traceback", "aiohttp"):
    assert noise not in out.stdout + out.stderr, noise


def search_states(db) -> dict[int, str]:
  with sqlite3.connect(db) as connection:
    return dict(connection.execute("SELECT number, state FROM trials ORDER BY number"))


def _search_experiment(tmp_path):
  """4 trials on the numbers task, some with a learning rate that moves nothing."""
  path = tmp_path / "tiny_search.py"
  path.write_text('"""A tiny search."""\nfrom launch import search\n'
                  'CONFIG = "configs/transformer.py:numbers"\n'
                  'SEARCH = search.Search(space={"optimizer.learning_rate_multiplier": '
                  'search.choice(1.0, 1e-9), "model.dropout_rate": search.uniform(0.0, 0.3)},'
                  ' metric="eval/loss", trials=4, seed=0)\n')
  return path


def test_a_searchs_tpu_dry_run_shows_each_trials_commands_and_creates_nothing(tmp_path,
                                                                              cloud):
  env, state = cloud
  out = _launch(env, f"--experiment={_search_experiment(tmp_path)}", f"--root={tmp_path}/r",
                "--accelerator_type=v5p-8", "--parallel=2", "--dry_run")
  assert out.returncode == 0, out.stderr[-3000:]
  lines = out.stdout.splitlines()
  assert lines[0] == f"# tiny_search's study: sqlite:///{tmp_path}/r/tiny_search/study.db " \
      "(the default)", lines
  assert lines[1].startswith("# search: 4 trials by tpe (seed 0)"), lines
  assert "# each trial on a TPU of its own, 2 at a time" in out.stdout
  create = lines.index("gcloud compute tpus tpu-vm create t-000 --accelerator-type=v5p-8 "
                       "--runtime-version=tpu-ubuntu2204-base --zone=us-east5-a")
  assert "--config.model.dropout_rate=VALUE" in lines[create + 3], lines[create + 3]
  assert lines[create + 4] == "gcloud compute tpus tpu-vm delete t-000 --quiet --zone=us-east5-a"
  assert lines[create + 5].startswith("# a trial the pruner stops: ") and "kill -TERM" in lines[-1]
  assert not (state / "calls").exists() and not (tmp_path / "r").exists()


@pytest.mark.parametrize("flags, message", [
    (["--accelerator_type=v5p-8", "--root=gs://bucket/runs"],
     "error: --root=gs://bucket/runs: a bucket holds no SQLite study or journal; give "
     "--storage"),
    (["--root=ROOT"], "error: --target=tpu: a search needs --tpu_name, --zone and "
                      "--accelerator_type"),
    (["--accelerator_type=v5p-64", "--root=ROOT", "--storage=sqlite:///ROOT.db"],
     "error: --root=ROOT is a local directory, but a v5p-64 has 8 hosts")])
def test_a_search_on_tpus_without_what_it_needs_is_refused_in_one_line(tmp_path, cloud,
                                                                         flags, message):
  env, state = cloud
  flags = [f.replace("ROOT", str(tmp_path / "r")) for f in flags]
  out = _launch(env, f"--experiment={_search_experiment(tmp_path)}", "--dry_run", *flags)
  assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
  assert out.stderr.startswith(message.replace("ROOT", str(tmp_path / "r"))), out.stderr
  assert not (state / "calls").exists() and not (tmp_path / "r").exists()


@pytest.mark.slow
def test_a_search_on_tpus_prunes_on_the_tpu_and_leaves_no_tpu(tmp_path, cloud):
  """The launcher holds the study (SQLite here), runs each drawn trial on a TPU of its
  own and reads its evaluations from the bucket: a trial that learns nothing, meeting
  one that learned, is pruned there: its run gets SIGTERM, checkpoints (exit.json says
  so) and its TPU is deleted. Every trial ends COMPLETE or PRUNED, no TPU is left, and
  launching again trains nothing."""
  env, state = cloud
  root = tmp_path / "bucket"
  flags = [f"--experiment={_search_experiment(tmp_path)}", f"--root={root}", "--smoke",
           "--accelerator_type=v5p-8", "--poll_s=0.5", "--set=train.num_train_steps=40",
           "--set=train.eval_every_steps=5", "--set=train.checkpoint_every_steps=5"]
  out = _launch(env, *flags, timeout=900)
  calls = (state / "calls").read_text()
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:] + calls[-2000:]
  folder = root / "tiny_search_smoke"
  events = (folder / "tpu_events.log").read_text()
  states = search_states(folder / "study.db")
  assert sorted(states) == [0, 1, 2, 3] and set(states.values()) <= {"COMPLETE", "PRUNED"}
  learning_before = False
  for number, trial_state in states.items():
    name, workdir = f"trial{number:03d}", folder / f"trial{number:03d}"
    multiplier = float(json.loads((workdir / "trial.json").read_text())["overrides"][
        "optimizer.learning_rate_multiplier"])
    if multiplier == 1e-9 and learning_before:
      assert trial_state == "PRUNED", (number, states)
    learning_before |= multiplier == 1.0
    assert (workdir / "pruned.json").exists() == (trial_state == "PRUNED"), number
    assert (workdir / "results.json").exists() == (trial_state == "COMPLETE"), number
    assert f"tpu-vm create t-{number:03d} " in calls and f"tpu-vm delete t-{number:03d} " in calls
    if trial_state == "PRUNED":
      assert f"{name} on t-{number:03d}: pruned at step " in events, events
      assert json.loads((workdir / "exit.json").read_text())["code"] == 75  # Checkpointed.
  assert "PRUNED" in states.values(), states
  with sqlite3.connect(folder / "study.db") as db:  # The device-hours' account: 4 chips.
    spent = db.execute("SELECT key, value_json FROM trial_user_attributes WHERE key IN "
                       "('devices', 'hosts')").fetchall()
  assert sorted(spent) == [("devices", "4")] * 4 + [("hosts", "1")] * 4, spent
  assert "kill -TERM" in calls and not list((state / "tpus").iterdir()), events
  again = _launch(env, *flags)
  assert again.returncode == 0 and "tpu-vm create" not in again.stdout, again.stdout[-2000:]
  assert search_states(folder / "study.db") == states
