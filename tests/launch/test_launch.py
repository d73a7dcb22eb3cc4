"""Experiments, sweeps, the launcher's targets and the results table."""

import glob
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from conftest import COMPARABLE_RUNS, ROOT, ROUNDING_CONTROL, SHARED_DATA
from conftest import assert_within_rounding
from conftest import checkpoint_state, max_relative_difference, outputs_of
from conftest import run_forked, start_training, xla_flags
from launch import pack, results, sweep, trials as trials_lib, tpu_vm
from launch.targets import local, slurm
from transformer_jax import config as config_lib

EXPERIMENTS = sorted(glob.glob(os.path.join(ROOT, "experiments", "*.py")))


def test_grid_zip_product_and_named_expand_as_documented():
  grid = sweep.grid({"optimizer.warmup_steps": [400, 800, 1600],
                     "model.dropout_rate": [0.1, 0.3]})
  assert len(grid) == 6 and len({t.name for t in grid}) == 6
  assert grid[0].name == "warmup_steps=400,dropout_rate=0.1"
  assert grid[0].flags == ["--config.optimizer.warmup_steps=400",
                           "--config.model.dropout_rate=0.1"]
  zipped = sweep.zipped({"model.d_model": [256, 512], "model.d_ff": [1024, 2048]})
  assert [dict(t.overrides) for t in zipped] == [{"model.d_model": 256, "model.d_ff": 1024},
                                                 {"model.d_model": 512, "model.d_ff": 2048}]
  with pytest.raises(ValueError, match="differ in length"):
    sweep.zipped({"a.b": [1, 2], "a.c": [1]})
  both = sweep.product(sweep.named(small={"model.d_model": 256}, large={}), zipped)
  assert len(both) == 4 and both[0].name.startswith("small,")
  assert dict(both[0].overrides)["model.d_model"] == 256  # The later sweep wins.
  assert len(sweep.chain(grid, zipped)) == 8


def test_clashing_short_names_fall_back_to_full_paths():
  [trial] = sweep.grid({"model.dropout_rate": [0.1], "train.dropout_rate": [0.2]})
  assert trial.name == "model.dropout_rate=0.1,train.dropout_rate=0.2"


def _apply(config, overrides):
  for path, value in overrides:
    *parents, field = path.split(".")
    node = config
    for name in parents:
      node = node[name]
    assert field in node, f"{path} is not a config field"
    node[field] = value
  return config


@pytest.mark.parametrize("path", EXPERIMENTS, ids=os.path.basename)
def test_every_experiment_loads_and_every_trial_is_a_valid_config(path):
  from configs import transformer as configs
  experiment = sweep.load_experiment(path)
  assert experiment.description and bool(experiment.trials) != bool(experiment.search)
  file, arg = experiment.config.split(":")
  assert os.path.exists(os.path.join(ROOT, file))
  trials = list(experiment.trials)
  if experiment.search:  # A search's space at its corners.
    assert not experiment.search.problems()
    trials = [sweep.Trial(str(i), tuple(corner.items()))
              for i, corner in enumerate(experiment.search.corners())]
  for trial in trials:
    config_lib.parse(_apply(configs.get_config(arg), trial.overrides))


def test_the_table3_experiment_has_rows_a_to_e():
  experiment = sweep.load_experiment(os.path.join(ROOT, "experiments", "table3.py"))
  rows = {t.name.split("_")[0] for t in experiment.trials} - {"base"}
  assert rows == {"A", "B", "C", "D", "E"}
  # Sec. 6.2: scored on newstest2013 with beam search, "but no checkpoint averaging".
  for trial in experiment.trials:
    overrides = dict(trial.overrides)
    assert (overrides["train.average_last"], overrides["train.final_test"]) == (1, False)


def test_the_documented_float32_override_undoes_the_reproductions_bfloat16(tmp_path):
  """The paper computed in float32: docs/paper.md names each reproduction experiment
  that sets bfloat16 as a departure, and the override it gives, added last to a command
  (the 8-GPU commands' own --set=model.dtype=bfloat16 included), computes in float32."""
  with open(os.path.join(ROOT, "docs", "paper.md"), encoding="utf-8") as f:
    row = next(line for line in f if line.startswith("| float32 |"))
  override = ("model.dtype", "float32")
  assert f"--set={override[0]}={override[1]}" in row
  dtypes = {}
  for path in glob.glob(os.path.join(ROOT, "experiments", "*_reproduction.py")):
    experiment = sweep.load_experiment(path)
    for extra in ((), (("model.dtype", "bfloat16"), override)):
      for run in trials_lib.plan(experiment, str(tmp_path), extra):
        config, error = trials_lib.parse(run)
        assert error is None, error
        dtypes[os.path.basename(path), bool(extra)] = config.model.dtype
  assert {dtype for (_, extra), dtype in dtypes.items() if extra} == {"float32"}
  assert dtypes["big_reproduction.py", False] == "bfloat16"  # As docs/scaling.md says.
  named = set(re.findall(r"experiments/(\w+\.py)", row.split("|")[2]))
  assert named == {name for (name, extra), dtype in dtypes.items() if dtype == "bfloat16"}

def _launch(*flags, env=None):
  return subprocess.run([sys.executable, "-m", "launch", *flags], cwd=ROOT,
                        capture_output=True, text=True, timeout=600,
                        env={**os.environ, **(env or {})})


def test_local_dry_run_prints_the_commands(tmp_path):
  out = _launch("--experiment=experiments/multi30k_lr_warmup.py", f"--root={tmp_path}",
                "--dry_run", "--set=data.manual_dir=/data/m30k")
  assert out.returncode == 0, out.stderr
  commands = [shlex.split(line) for line in out.stdout.splitlines() if not line.startswith("#")]
  assert len(commands) == 9
  first = commands[0]
  assert first[1:3] == ["-m", "transformer_jax.main"]
  assert "--config=configs/transformer.py:multi30k" in first
  assert f"--workdir={tmp_path}/multi30k_lr_warmup/learning_rate_multiplier=0.5," \
         "warmup_steps=400" in first
  assert "--config.data.manual_dir=/data/m30k" in first
  assert not os.listdir(tmp_path)  # A dry run writes nothing.


def test_set_values_keep_their_own_equals_signs(tmp_path):
  """--set=PATH=VALUE splits at the first "=": paths and overrides may hold more."""
  out = _launch("--experiment=experiments/multi30k_lr_warmup.py", f"--root={tmp_path}",
                "--dry_run", "--set=data.manual_dir=/data/a=b", "--set=train.seed=7")
  assert out.returncode == 0, out.stderr
  first = shlex.split(next(l for l in out.stdout.splitlines() if not l.startswith("#")))
  assert "--config.data.manual_dir=/data/a=b" in first and "--config.train.seed=7" in first


def test_a_trial_with_checkpoints_but_no_results_is_resumed_not_skipped(tmp_path):
  """Only results.json marks a trial finished: one stopped midway (checkpoints, exit.json)
  is launched again, and resumes from its checkpoint."""
  experiment = sweep.load_experiment("experiments/multi30k_lr_warmup.py")
  runs = trials_lib.plan(experiment, str(tmp_path))
  stopped, done = runs[0].workdir, runs[1].workdir
  os.makedirs(os.path.join(stopped, "checkpoints", "10"))
  with open(os.path.join(stopped, "exit.json"), "w") as f:
    f.write('{"code": 75, "reason": "stopped"}')
  os.makedirs(done)
  with open(os.path.join(done, "results.json"), "w") as f:
    f.write("{}")
  assert not trials_lib.finished(runs[0]) and trials_lib.finished(runs[1])
  out = _launch("--experiment=experiments/multi30k_lr_warmup.py", f"--root={tmp_path}",
                "--dry_run", "--set=data.manual_dir=/data/m30k")
  assert out.returncode == 0, out.stderr
  commands = [l for l in out.stdout.splitlines() if not l.startswith("#")]
  assert len(commands) == len(runs) - 1
  assert any(f"--workdir={stopped}" in c for c in commands)
  assert f"# {runs[1].trial.name}: finished, skipped" in out.stdout


def test_slurm_dry_run_is_an_array_job_with_one_task_per_gpu(tmp_path):
  out = _launch("--experiment=experiments/table3.py", "--target=slurm", "--dry_run",
                f"--root={tmp_path}", "--nodes=2", "--gpus_per_node=8", "--partition=a100",
                "--time=48:00:00", "--account=nlp", "--qos=high", "--mem=0",
                "--cpus_per_task=12", "--sbatch=--exclusive", "--sbatch=--constraint=h100",
                "--max_running=4")
  assert out.returncode == 0, out.stderr
  script = out.stdout
  sbatch = dict(re.findall(r"^#SBATCH --([\w-]+)=(.*)$", script, re.M))
  assert sbatch["array"] == "0-18%4" and sbatch["nodes"] == "2"  # 4 trials at a time.
  assert sbatch["ntasks-per-node"] == "8" and sbatch["gpus-per-node"] == "8"
  assert (sbatch["partition"], sbatch["time"]) == ("a100", "48:00:00")
  assert (sbatch["account"], sbatch["qos"], sbatch["mem"], sbatch["cpus-per-task"],
          sbatch["constraint"]) == ("nlp", "high", "0", "12", "h100")
  assert "\n#SBATCH --exclusive\n" in script
  cases = re.findall(r"^  (\d+)\) ARGS=\((.*)\) ;;  # (\S+)$", script, re.M)
  assert len(cases) == 19
  index, args, name = cases[2]
  assert name == "A_heads4" and "--config.model.num_heads=4" in shlex.split(args)
  assert f"--config.data.tfds_data_dir={tmp_path}/tensorflow_datasets" in shlex.split(args)
  prepare = 'JAX_PLATFORMS=cpu python -m transformer_jax.main "${ARGS[@]}" --prepare_data\n'
  srun = 'srun python -m transformer_jax.main "${ARGS[@]}"'
  assert srun in script and script.index(prepare) < script.index(srun)  # Once, first.
  code_dir = f"{tmp_path}/table3/code/{pack.describe(ROOT)['fingerprint']}"
  assert f"\ncd {code_dir}\nexport PYTHONPATH=\"$PWD\"\n" in script
  assert "# would unpack the code (" in script and not os.listdir(tmp_path)
  assert re.search(r"^# would run: sbatch \S+/table3/sbatch\.sh$", script, re.M)


def test_every_targets_dry_run_prints_the_whole_cost_part_by_part(tmp_path):
  """Local (--cost_on, else this machine's own GPUs), SLURM (NODES x GPUS_PER_NODE
  H100s) and TPU (--accelerator_type) dry runs print each trial's cost from the one
  model, planning/cost.py: the same parts, the same figures on the same hardware; a
  --cost_on that names no hardware is refused in one line."""
  flags = ("--experiment=experiments/base_reproduction.py", f"--root={tmp_path}",
           "--dry_run")
  outs = {"8xH100": _launch(*flags, "--cost_on=8xH100"),
          "slurm": _launch(*flags, "--target=slurm", "--nodes=1", "--gpus_per_node=8"),
          "v5p-8": _launch(*flags, "--target=tpu", "--tpu_name=t", "--zone=z",
                           "--accelerator_type=v5p-8", "--skip_fit_check")}
  printed = {}
  for name, out in outs.items():
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# base: cost on "))
    printed[name] = lines[start:start + 8]
    assert [line.split(":")[0] for line in printed[name][1:]] == [
        f"#   {part}" for part in ("training", "held-out losses", "mid-run BLEU decodes",
                                 "final averaged decodes", "checkpoint writes",
                                 "compilation", "data preparation")]
  assert printed["slurm"] == printed["8xH100"]
  assert printed["v5p-8"][0].startswith("# base: cost on v5p-8 (4 chips, 1 host(s)): ")
  assert "no step measured on TPU v5, so a lower bound" in printed["v5p-8"][1]
  own = _launch(*flags)  # This machine: CPU devices only.
  assert "# cost: not estimated for this machine's 8 cpu device(s); --cost_on=" in own.stdout
  assert "# base: cost on" not in own.stdout
  bad = _launch(*flags, "--cost_on=9xH100")
  assert bad.returncode == 2 and bad.stderr.strip().startswith("error: --cost_on=9xH100: ")
  assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_a_run_of_several_processes_reads_data_prepared_once_where_all_read_it(tmp_path):
  """Locally with --processes=2: one command prepares the trial's data, then the two
  processes start, all on this machine, in TFDS's own folder (a dataset already built
  there is not built again). On several SLURM nodes TFDS's folder is the root's (TFDS's
  default is each machine's own home), unless data.tfds_data_dir names one; on one node
  it stays TFDS's own. One process prepares nothing beforehand; nor does
  --prepare_data=false."""
  def commands(*flags):
    out = _launch("--experiment=experiments/base_reproduction.py", f"--root={tmp_path}",
                  "--dry_run", *flags)
    assert out.returncode == 0, out.stderr
    return [shlex.split(line) for line in out.stdout.splitlines() if not line.startswith("#")]

  shared = f"--config.data.tfds_data_dir={tmp_path}/tensorflow_datasets"
  prepare, *train = commands("--processes=2")
  assert prepare[-1] == "--prepare_data" and len(train) == 2
  assert not any(a.startswith("--config.data.tfds_data_dir=") for c in (prepare, *train)
                 for a in c)
  assert prepare[:-1] == train[0][:len(prepare) - 1]  # The same config and workdir.
  slurm = lambda *flags: " ".join(" ".join(c) for c in commands("--target=slurm", *flags))
  assert shared in slurm("--nodes=2", "--gpus_per_node=1")
  assert shared not in slurm("--nodes=1", "--gpus_per_node=8")
  mine = slurm("--nodes=2", "--gpus_per_node=1", "--set=data.tfds_data_dir=/shared/tfds")
  assert "--config.data.tfds_data_dir=/shared/tfds" in mine and shared not in mine
  assert len(commands("--processes=2", "--prepare_data=false")) == 2
  [alone] = commands()
  assert "--prepare_data" not in alone and shared not in alone
  assert not os.listdir(tmp_path)


def test_tpu_dry_run_ships_the_code_to_every_worker_then_runs_it_there(tmp_path):
  out = _launch("--experiment=experiments/big_reproduction.py", "--target=tpu", "--dry_run",
                "--tpu_name=pod", "--zone=us-east5-a", "--project=p", f"--root={tmp_path}")
  assert out.returncode == 0, out.stderr
  code = pack.describe(ROOT)["fingerprint"]
  assert f"# code {code}: " in out.stdout
  commands = [shlex.split(line) for line in out.stdout.splitlines() if not line.startswith("#")]
  assert len(commands) == 4
  for command, worker in zip(commands, ["all", "all", "0", "all"]):
    assert command[:4] == ["gcloud", "compute", "tpus", "tpu-vm"]
    assert {"--zone=us-east5-a", "--project=p", f"--worker={worker}"} <= set(command)
  copy, unpack, [prepare], train = (
      [a for a in c if a.startswith("--command=")] or c for c in commands)
  name = f"transformer_jax_{code}.tar.gz"
  assert copy[4:7] == ["scp", f"{tpu_vm.PACKS}/{name}", f"pod:{name}"]
  directory = f"~/transformer_jax_code/{code}"
  assert unpack == [f"--command=mkdir -p {directory} && tar -xzf ~/{name} -C {directory}"
                        f" && rm ~/{name} && cd {directory} && {{ [ -f .installed ] || "
                        f"{{ {tpu_vm.VENV} && .venv/bin/pip install -q -e '.[tpu,tfds]' && "
                        "touch .installed; }; }"]
  [train] = train
  # The data prepared once, on worker 0, before any worker's process starts.
  assert prepare.startswith(f"--command=cd {directory} && ") and (
      "JAX_PLATFORMS=cpu .venv/bin/python -m transformer_jax.main --config=configs/"
      "transformer.py:big") in prepare and " --prepare_data 2>&1 | tee -a ~/transformer_" \
      "jax_logs/big_reproduction/big.prepare.log" in prepare and "a run is going" in prepare
  assert f"--config.data.tfds_data_dir={tmp_path}/tensorflow_datasets" in train
  assert train.startswith(f"--command=cd {directory} && ")
  assert ".venv/bin/python -m transformer_jax.main --config=configs/transformer.py:big" in train
  assert "--config.model.dtype=bfloat16" in train
  # Detached from ssh, one log per trial and worker, never two runs on one worker.
  assert "nohup bash -c " in train and "< /dev/null & echo $! > ~/transformer_jax_run.pid" in train
  assert "> ~/transformer_jax_logs/big_reproduction/big.$(hostname).log 2>&1" in train
  assert not os.listdir(tmp_path)  # A dry run writes nothing.

  repo = _launch("--experiment=experiments/big_reproduction.py", "--target=tpu", "--dry_run",
                 "--tpu_name=pod", "--zone=z", f"--root={tmp_path}", "--repo_dir=~/tj")
  assert repo.returncode == 2 and "--repo_dir=~/tj conflicts with shipping" in repo.stderr
  noship = _launch("--experiment=experiments/big_reproduction.py", "--target=tpu",
                   "--dry_run", "--tpu_name=pod", "--zone=z", f"--root={tmp_path}",
                   "--noship", "--repo_dir=~/tj")
  assert noship.returncode == 0, noship.stderr
  assert "--command=cd ~/tj && { [ -f .installed ]" in noship.stdout and " scp " not in noship.stdout


def test_trial_names_cannot_leave_the_root(tmp_path):
  experiment = tmp_path / "escape.py"
  experiment.write_text('"""Escapes."""\nfrom launch import sweep\n'
                        'CONFIG = "configs/transformer.py:numbers"\n'
                        'def trials():\n'
                        '  return [sweep.Trial("../../etc", ())]\n')
  with pytest.raises(ValueError, match="trial name '../../etc' is not a plain directory"):
    sweep.load_experiment(str(experiment))
  out = _launch(f"--experiment={experiment}", f"--root={tmp_path}/runs", "--dry_run")
  assert out.returncode == 2 and "not a plain directory name" in out.stderr
  assert "Traceback" not in out.stderr and not (tmp_path / "runs").exists()


def test_smoke_trials_never_share_a_workdir_with_full_ones():
  experiment = sweep.load_experiment(os.path.join(ROOT, "experiments", "table3.py"))
  full = {r.workdir for r in trials_lib.plan(experiment, "gs://b/runs")}
  smoke = {r.workdir for r in trials_lib.plan(experiment, "gs://b/runs", smoke=True)}
  assert not full & smoke and all(w.startswith("gs://b/runs/table3_smoke/") for w in smoke)


def _script(tmp_path, name, text):
  path = tmp_path / "bin" / name
  path.parent.mkdir(exist_ok=True)
  path.write_text("#!/bin/bash\n" + text)
  path.chmod(0o755)


@pytest.mark.parametrize("run_exit,requeued", [(None, True), (0, False), (3, False)])
def test_slurm_task_checkpoints_and_requeues_itself_at_the_time_limit(tmp_path, run_exit,
                                                                        requeued):
  """SLURM's USR1 before the time limit reaches the run as SIGTERM; a run that exits 75
  (checkpointed) is requeued, one that finished or failed is not. `srun` and `scontrol`
  are stand-ins: the first behaves as transformer_jax.main does on SIGTERM."""
  experiment = sweep.load_experiment(os.path.join(ROOT, "experiments", "base_reproduction.py"))
  runs = trials_lib.plan(experiment, str(tmp_path / "runs"))
  script = slurm.array_script(experiment, runs, nodes=1, gpus_per_node=1, code_dir=ROOT,
                              activate=None, sbatch=["--time=1:00:00"], prepare=False)
  assert "#SBATCH --requeue" in script and "#SBATCH --signal=B:USR1@300" in script
  body = "sleep 30 & SLEEP=$!; wait" if run_exit is None else f"exit {run_exit}"
  _script(tmp_path, "srun", f"trap 'kill $SLEEP; sleep 0.5; exit 75' TERM\n{body}\n")
  _script(tmp_path, "scontrol", f'echo "$@" > {tmp_path}/scontrol.txt\n')
  (tmp_path / "sbatch.sh").write_text(script)
  env = {**os.environ, "PATH": f"{tmp_path}/bin:{os.environ['PATH']}",
         "SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_JOB_ID": "77"}
  proc = subprocess.Popen(["bash", str(tmp_path / "sbatch.sh")], env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  if run_exit is None:
    time.sleep(1.0)
    proc.send_signal(signal.SIGUSR1)
  out = proc.communicate(timeout=60)[0]
  assert proc.returncode == (75 if run_exit is None else run_exit), out
  assert (tmp_path / "scontrol.txt").exists() == requeued, out
  if requeued:
    assert (tmp_path / "scontrol.txt").read_text().split() == ["requeue", "77_0"]


def test_a_failed_process_of_a_local_trial_stops_its_siblings(tmp_path):
  crash = [sys.executable, "-c", "import time, sys; time.sleep(0.5); sys.exit(3)"]
  wait = [sys.executable, "-c", "import signal, sys, time\n"
          "signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))\ntime.sleep(120)"]
  start = time.time()
  codes, stopped = local._run_together([wait, crash, wait], str(tmp_path / "launch.log"))
  assert codes == [75, 3, 75] and not stopped and time.time() - start < 30


def test_sigterm_to_the_local_launcher_alone_reaches_its_trial(tmp_path):
  """`kill LAUNCHER` (a supervisor, nohup's owner) signals the launcher only: its trial
  gets the SIGTERM too, so it checkpoints and exits rather than training on orphaned,
  and the launcher stops as after Ctrl-C."""
  stopped, log = str(tmp_path / "stopped"), str(tmp_path / "log")
  trial = ("import signal, sys, time\n"
           f"def stop(*_):\n  open({stopped!r}, 'w').close(); sys.exit(75)\n"
           "signal.signal(signal.SIGTERM, stop)\nprint('ready', flush=True)\ntime.sleep(120)")
  script = ("import sys\nfrom launch.targets import local\ntry:\n"
            f"  local._run_together([[sys.executable, '-c', {trial!r}]], {log!r})\n"
            "except KeyboardInterrupt:\n  print('interrupted', flush=True)\n")
  proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  assert proc.stdout.readline().strip() == "ready"
  proc.send_signal(signal.SIGTERM)  # To the launcher only, not its process group.
  out = proc.communicate(timeout=60)[0]
  assert proc.returncode == 0 and "interrupted" in out, out
  assert os.path.exists(stopped)


def test_the_launchers_sigterm_handler_is_in_place_before_its_trial_starts(
    tmp_path, monkeypatch):
  """Else a SIGTERM in that window ends (or, where SIGTERM is ignored, misses) the
  launcher and leaves the trial running."""
  handlers, popen = [], subprocess.Popen

  def recording_popen(*args, **kwargs):
    handlers.append(signal.getsignal(signal.SIGTERM))
    return popen(*args, **kwargs)
  monkeypatch.setattr(local.subprocess, "Popen", recording_popen)
  before = signal.getsignal(signal.SIGTERM)
  assert local._run_together([[sys.executable, "-c", "pass"]] * 2,
                                str(tmp_path / "log")) == ([0, 0], False)
  assert len(handlers) == 2 and before not in handlers
  assert signal.getsignal(signal.SIGTERM) == before


@pytest.mark.parametrize("target,tool,flags", [
    ("slurm", "sbatch", []), ("tpu", "gcloud", ["--tpu_name=pod", "--zone=z"])])
def test_missing_cluster_tools_give_a_clear_error(tmp_path, target, tool, flags):
  out = _launch("--experiment=experiments/base_reproduction.py", f"--target={target}",
                f"--root={tmp_path}", *flags, env={"PATH": str(tmp_path)})
  assert out.returncode == 2
  assert f"needs `{tool}` on PATH" in out.stderr and "Traceback" not in out.stderr


def _seeds_experiment(tmp_path):
  """An experiment of two trials, seeds 0 and 1 on the numbers task (seeds change no
  compiled program, so the second trial loads the first one's)."""
  experiment = tmp_path / "seeds.py"
  experiment.write_text('"""Two seeds on the numbers task."""\nfrom launch import sweep\n'
                        'CONFIG = "configs/transformer.py:numbers"\n'
                        'def trials():\n'
                        '  return sweep.grid({"train.seed": [0, 1]})\n')
  return experiment


@pytest.mark.slow
def test_a_two_trial_sweep_runs_locally_and_compares(tmp_path):
  experiment = _seeds_experiment(tmp_path)
  root = tmp_path / "runs"
  out = _launch(f"--experiment={experiment}", f"--root={root}", "--smoke")
  assert out.returncode == 0, out.stderr[-3000:]
  for name in ("seed=0", "seed=1"):
    workdir = root / "seeds_smoke" / name
    assert (workdir / "results.json").exists() and (workdir / "config.json").exists()
    log = (workdir / "launch.log").read_text()  # The trial's own log stays with it,
    assert "compiled" in log and "Held-out" in log, log[-2000:]
  assert "Held-out" in out.stdout  # and still reaches the terminal.
  again = _launch(f"--experiment={experiment}", f"--root={root}", "--smoke")
  assert again.stdout.count("finished, skipped") == 2

  csv_path, png = tmp_path / "table.csv", tmp_path / "curves.png"
  wrong = ((["--sort=bleu"], "--sort='bleu': no trial wrote this metric"),
           ([f"--plot={tmp_path / 'no.png'}", "--curve=train/los"],
            "(did you mean 'train/loss'?)"))
  trials = [f"--experiment={experiment}", f"--root={root}", "--smoke"]
  (tmp_path / "results").mkdir()  # The table, then two mistakes: forked from one import.
  (code, stdout, err), *mistakes = run_forked(
      [("launch.results", [*trials, *flags], None) for flags in (
          ["--sort=eval/loss", f"--csv={csv_path}", f"--plot={png}"], *(f for f, _ in wrong))],
      tmp_path / "results")
  assert code == 0, err[-3000:]
  lines = csv_path.read_text().splitlines()
  assert lines[0].split(",")[:3] == ["trial", "status", "best eval/bleu"]
  assert len(lines) == 3 and all(line.split(",")[1] == "finished" for line in lines[1:])
  assert "status: not started" in stdout  # The columns are defined.
  losses = [float(line.split(",")[4]) for line in lines[1:]]
  assert losses == sorted(losses)  # Sorted by best eval/loss, lowest first.
  assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
  rows = results.collect(sweep.load_experiment(str(experiment)), str(root), "eval/loss",
                         smoke=True)
  assert all(row["steps"] == 20 for row in rows)
  for (code, _, err), (_, phrase) in zip(mistakes, wrong, strict=True):
    assert code == 2 and phrase in err, err[-2000:]
  assert not (tmp_path / "no.png").exists()


# The offline text the rehearsals read (docs/paper.md says where else to get it).
NEEDS_SHARED_TEXT = pytest.mark.skipif(
    not all(os.path.exists(os.path.join(SHARED_DATA, d)) for d in ("multi30k", "newstest2014")),
    reason=f"needs the offline text, multi30k/ and newstest2014/, in {SHARED_DATA} "
           "(../shared/data beside the repository, or $SHARED_DATA)")
REHEARSAL = "python -m launch --experiment=experiments/base_reproduction.py --smoke"
ONE_PROCESS_REHEARSAL, TWO_NODE_REHEARSAL = REHEARSAL + " --set=", REHEARSAL + " --target=slurm"


def _documented(prefix: str, root, before_root: str = "") -> str:
  """docs/paper.md's one line that starts with `prefix` and ends with `--root=DIR`:
  DIR made `root`, `before_root` put before that flag, ../shared/data made
  $SHARED_DATA."""
  with open(os.path.join(ROOT, "docs", "paper.md"), encoding="utf-8") as f:
    lines = [line for line in f.read().splitlines() if line.startswith(prefix)]
  assert len(lines) == 1 and lines[0].endswith(" --root=DIR"), lines
  shared = os.path.abspath(SHARED_DATA)
  line = lines[0].replace("$PWD/../shared/data", shared).replace("../shared/data", shared)
  return line.removesuffix("--root=DIR") + f"{before_root} --root={root}".lstrip()


@NEEDS_SHARED_TEXT
@pytest.mark.slow
def test_the_documented_rehearsal_of_the_base_reproduction_ends_with_the_papers_line(
    tmp_path):
  """docs/paper.md's dress rehearsal, as written: experiments/base_reproduction.py
  through the launcher with --smoke, the real newstest2014 (3,003 sentences) as the
  test set: results.json and the run's last line carry the paper-style BLEU, the
  sacreBLEU with its signature and Table 2's 27.3 (Sec. 6.1), for the mean of the last
  two checkpoints; launch.results shows them. Only the path is checked, not a figure."""
  command = shlex.split(_documented(ONE_PROCESS_REHEARSAL, tmp_path))
  out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "XLA_FLAGS": xla_flags(1), "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 0, out.stderr[-3000:]
  workdir = tmp_path / "base_reproduction_smoke" / "base"
  test = json.loads((workdir / "results.json").read_text())["test"]
  assert (test["set"], test["sentences"], test["paper"]) == ("newstest2014", 3003, 27.3)
  assert test["averaged"] == [10, 20] and (test["beam_size"], test["alpha"]) == (2, 0.6)
  assert 0 <= test["paper_bleu"] <= 100 and 0 <= test["bleu"] <= 100
  assert test["signature"].startswith("nrefs:1|case:mixed|")
  last = (workdir / "launch.log").read_text().splitlines()[-1]
  assert last == (f"Test newstest2014 (3003 sentences; the mean of the last 2 checkpoints, "
                  f"beam 2, alpha 0.6): paper-style BLEU {test['paper_bleu']:.2f}, "
                  f"sacreBLEU {test['bleu']:.2f}; the paper's base: 27.3 "
                  f"[{test['signature']}]"), last
  hypotheses = (workdir / "translations" / "newstest2014_step_20_avg2.txt").read_text()
  assert len(hypotheses.splitlines()) == 3003
  table = subprocess.run([sys.executable, "-m", "launch.results",
                          "--experiment=experiments/base_reproduction.py",
                          f"--root={tmp_path}", "--smoke"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert table.returncode == 0, table.stderr[-2000:]
  header, row = table.stdout.splitlines()[1:3]  # Under the title line.
  assert "test paper BLEU" in header and "test sacreBLEU" in header \
      and "newstest2014" in row, table.stdout


def _two_node_rehearsal(root, before_root: str = "") -> subprocess.CompletedProcess:
  """docs/paper.md's two-node rehearsal line, run by bash as written (its $PWD), with
  this Python first on PATH (the job's `python`)."""
  path = f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}"
  return subprocess.run(["bash", "-c", _documented(TWO_NODE_REHEARSAL, root, before_root)],
                        cwd=ROOT, capture_output=True, text=True, timeout=1500,
                        env={**os.environ, "PATH": path})


@NEEDS_SHARED_TEXT
@pytest.mark.slow
def test_the_documented_two_node_rehearsal_prepares_the_data_once_and_ends_with_the_papers_line(
    tmp_path):
  """docs/paper.md's two-node rehearsal, as written: SLURM's stand-in runs the batch
  shell, which prepares the data (Multi30k's TFDS dataset, built here, the tokenizer,
  the tokenized split) once, then two processes, each a node with its own HOME and 4
  devices, which read it. Across the three logs one `data:` line says it built the
  data, in the batch shell, and names the shared root's TFDS folder; each process's
  says it read it. Process 0's log, and the launcher's output, end with the
  newstest2014 line of the results."""
  out = _two_node_rehearsal(tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  folder = tmp_path / "base_reproduction_smoke"
  [batch] = folder.glob("slurm-*_0.out")
  logs = {log: log.read_text() for log in [batch, *folder.glob("slurm-*_0.out.node*")]}
  data = {log.name.split(".out")[1]: [line for line in text.splitlines()
                                      if line.startswith("data: ")]
          for log, text in logs.items()}
  assert sorted(data) == ["", ".node0.task0", ".node1.task1"], data
  assert all(len(lines) == 1 for lines in data.values()), data
  built = data[""][0]
  assert "built it here" in built and f"{tmp_path}/tensorflow_datasets/multi30k" in built
  for task in (".node0.task0", ".node1.task1"):
    assert "read what was prepared, building nothing" in data[task][0], data
  homes = [folder / "standin_homes" / f"node{i}" for i in (0, 1)]
  assert all(home.is_dir() and not (home / "tensorflow_datasets").exists() for home in homes)
  test = json.loads((folder / "base" / "results.json").read_text())["test"]
  assert (test["set"], test["sentences"], test["averaged"]) == ("newstest2014", 3003, [10, 20])
  last = (f"Test newstest2014 (3003 sentences; the mean of the last 2 checkpoints, beam 2, "
          f"alpha 0.6): paper-style BLEU {test['paper_bleu']:.2f}, sacreBLEU "
          f"{test['bleu']:.2f}; the paper's base: 27.3 [{test['signature']}]")
  [process_0] = [text for log, text in logs.items() if log.name.endswith(".node0.task0")]
  assert process_0.splitlines()[-1] == last and out.stdout.splitlines()[-1] == last


@NEEDS_SHARED_TEXT
@pytest.mark.slow
def test_the_two_node_rehearsal_told_not_to_prepare_unprepared_data_stops_in_one_line(
    tmp_path):
  """The two-node rehearsal with --prepare_data=false on a root where nothing was
  prepared: each process builds nothing and stops, exit 2; the launcher's one error
  line names what is missing and the command that prepares it; nothing is built,
  trained or removed (a file already in the workdir stays)."""
  workdir = tmp_path / "base_reproduction_smoke" / "base"
  workdir.mkdir(parents=True)
  (workdir / "notes.txt").write_text("mine")
  out = _two_node_rehearsal(tmp_path, "--prepare_data=false")
  assert out.returncode == 2, out.stderr[-3000:]
  [line] = out.stderr.strip().splitlines()
  assert line.startswith("error: sbatch ") and " failed: array task 0 exited 2: " in line
  assert f"the TFDS dataset multi30k is not prepared in {tmp_path}/tensorflow_datasets" in line
  assert "a run of 2 processes builds no data" in line and "--prepare_data (" in line
  assert (workdir / "notes.txt").read_text() == "mine"
  assert not (tmp_path / "tensorflow_datasets").exists()
  assert not (workdir / "tokenizer.model").exists() and not (workdir / "tokenized").exists()
  assert not list(workdir.glob("checkpoints/*"))


@pytest.mark.slow
def test_two_launchers_on_one_root_train_each_trial_once_and_both_end_well(tmp_path):
  """The second launcher, started while the first trains seed=0, reports that trial as
  running elsewhere (host and pid), not failed, trains seed=1 itself, and waits for
  seed=0; the first, reaching seed=1, does the same. Both exit 0; each trial was
  trained once."""
  experiment = _seeds_experiment(tmp_path)
  root = tmp_path / "runs"
  flags = [sys.executable, "-m", "launch", f"--experiment={experiment}", f"--root={root}",
           "--smoke", "--set=train.num_train_steps=40", "--poll_s=1"]
  first = subprocess.Popen(flags, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
  lease = root / "seeds_smoke" / "seed=0" / "lock.json"
  deadline = time.time() + 300
  while not lease.exists() and time.time() < deadline:
    time.sleep(0.1)
  second = subprocess.run(flags, cwd=ROOT, capture_output=True, text=True, timeout=900)
  out, err = first.communicate(timeout=900)
  assert first.returncode == 0 and second.returncode == 0, (err + second.stderr)[-3000:]
  holder = re.search(r"# seed=0: running elsewhere \(process (\d+) on host (\S+)",
                     second.stdout)
  assert holder and "seed=0: finished elsewhere" in second.stdout, second.stdout[-3000:]
  assert "failed" not in second.stdout + second.stderr + out + err
  for name in ("seed=0", "seed=1"):
    log = (root / "seeds_smoke" / name / "launch.log").read_text()
    assert log.count("Held-out (") == 1, log[-3000:]  # Trained and evaluated once.
    assert (root / "seeds_smoke" / name / "results.json").exists()


@pytest.mark.parametrize("exit_code, writes_results, outcome", [
    (0, True, "done"),
    (2, True, "elsewhere"),  # Refused (the other launcher held it), then finished there.
    (2, False, "failed"),    # Refused, and nobody holds or finished it: a failure.
    (1, True, "failed"),     # Crashed: not the other launcher's doing.
])
def test_a_trial_the_other_launcher_finished_meanwhile_counts_as_finished(
    tmp_path, capsys, exit_code, writes_results, outcome):
  """A trial whose process exits 2 because another launcher's run held its workdir, and
  which that run finished meanwhile (results.json, the lease released), is finished
  elsewhere, not failed; exit 2 with no results, or any crash, is a failure."""
  import types
  run = trials_lib.Run(sweep.Trial("seed=0", ()), str(tmp_path / "seed=0"), ())
  os.makedirs(run.workdir)
  write = (f"open({os.path.join(run.workdir, 'results.json')!r}, 'w').write('{{}}'); "
           if writes_results else "")
  command = [sys.executable, "-c", f"{write}raise SystemExit({exit_code})"]
  got = local.run_trial(run, types.SimpleNamespace(name="seeds"), {}, [command])
  assert got == outcome, capsys.readouterr()
  assert ("failed" in capsys.readouterr().err) == (outcome == "failed")


@pytest.mark.slow
def test_ctrl_c_on_a_local_sweep_stops_the_trial_after_its_checkpoint_in_one_line(tmp_path):
  """Ctrl-C reaches the launcher and its trial (one process group, as in a terminal):
  the trial checkpoints and exits 75; the launcher says so in one line, no traceback."""
  experiment = tmp_path / "one.py"
  experiment.write_text('"""One trial."""\nfrom launch import sweep\n'
                        'CONFIG = "configs/transformer.py:numbers"\n'
                        'def trials():\n  return sweep.grid({"train.seed": [0]})\n')
  # As from a terminal, where Ctrl-C raises KeyboardInterrupt: a shell starts background
  # jobs (CI, nohup) with SIGINT ignored, and a Python started so keeps ignoring it.
  launcher = ("import runpy, signal, sys; signal.signal(signal.SIGINT, "
              "signal.default_int_handler); sys.argv[0] = 'launch'; "
              "runpy.run_module('launch', run_name='__main__', alter_sys=True)")
  proc = subprocess.Popen(
      [sys.executable, "-c", launcher, f"--experiment={experiment}", f"--root={tmp_path}",
       "--smoke", "--set=train.num_train_steps=100000"], cwd=ROOT, text=True,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
  for line in proc.stdout:  # The trial's process 0 writes to the launcher's terminal.
    if "compiled" in line and "programs in" in line:
      break
  time.sleep(1.0)
  os.killpg(proc.pid, signal.SIGINT)
  out = proc.communicate(timeout=300)[0]
  assert proc.returncode == 75, out[-3000:]
  assert "Traceback" not in out and "seed=0: interrupted" in out, out[-3000:]
  workdir = tmp_path / "one_smoke" / "seed=0"
  assert json.loads((workdir / "exit.json").read_text())["code"] == 75
  assert os.listdir(workdir / "checkpoints")


def test_results_tell_a_trials_status_from_its_workdir(tmp_path):
  """Not started, running (no end recorded), finished, and how a run that ended early
  ended, as main records it in exit.json."""
  def workdir(name, **written):
    path = tmp_path / name
    path.mkdir()
    for file, text in written.items():
      (path / file.replace("_json", ".json")).write_text(text)
    return str(path)
  assert results.trial_status(str(tmp_path / "absent")) == "not started"
  assert results.trial_status(workdir("running", config_json="{}")) == "running"
  assert results.trial_status(workdir("bad", **{"launch.log": "error: data.x\n"})) == (
      "failed at start-up (launch.log)")
  assert results.trial_status(workdir("done", config_json="{}", results_json="{}")) == "finished"
  for code, status in ((75, "stopped"), (3, "non-finite"), (1, "failed")):
    ended = workdir(f"ended_{code}", config_json="{}", exit_json=json.dumps({"code": code}))
    assert results.trial_status(ended) == status


@pytest.mark.parametrize("record, kept", [("best.json", "checkpoints"),
                                          ("best/best.json", "best")])  # And the earlier.
def test_results_name_the_best_checkpoint_only_while_it_is_kept(tmp_path, record, kept):
  (tmp_path / record).parent.mkdir(exist_ok=True)
  (tmp_path / record).write_text(json.dumps({"metric": "eval/bleu", "value": 39.33,
                                             "step": 6000}))
  assert results.kept_best(str(tmp_path)) is None  # Recorded, but its checkpoint is gone.
  (tmp_path / kept / "6000").mkdir(parents=True)
  assert results.kept_best(str(tmp_path)) == "eval/bleu 39.33 @6000"


@pytest.mark.slow
def test_a_requeued_slurm_task_resumes_with_the_same_code_on_fewer_nodes(tmp_path):
  """The launcher unpacks the code beside the runs and submits (stand-in sbatch). The
  first allocation runs 2 tasks (stand-in srun: processes here, found by JAX through
  SLURM's variables) until SLURM's USR1; the task checkpoints and requeues itself
  (stand-in scontrol). The second allocation has 1 node: the same code resumes the
  checkpoint and trains as an uninterrupted run does. Compared at step 16: at step 17
  this config meets a gradient spike that grows float noise; two uninterrupted runs, on
  1 and 2 processes, differ by 1e-6 at step 15 and 7e-3 at step 20, on the same batches."""
  experiment = tmp_path / "one.py"
  experiment.write_text('"""One trial."""\nfrom launch import sweep\n'
                        'CONFIG = "configs/transformer.py:numbers"\n'
                        'def trials():\n  return sweep.named(base={})\n')
  _script(tmp_path, "sbatch", f'echo "$1" > {tmp_path}/submitted\necho "Submitted batch job 7"\n')
  _script(tmp_path, "scontrol", f'echo "$@" >> {tmp_path}/scontrol.txt\n')
  _script(tmp_path, "srun", 'pids=()\n'
          'for ((i = 0; i < SLURM_NTASKS; i++)); do\n'
          '  SLURM_PROCID=$i SLURM_LOCALID=0 SLURM_STEP_NODELIST=localhost '
          'SLURM_STEP_NUM_NODES=$SLURM_NTASKS "$@" > "task$i.log" 2>&1 & pids+=($!)\n'
          'done\n'
          "trap 'kill -TERM \"${pids[@]}\"' TERM\n"
          'code=0\nfor p in "${pids[@]}"; do\n'
          '  while kill -0 "$p" 2>/dev/null; do wait "$p" || true; done\n'
          '  wait "$p" || code=$?\ndone\nexit "$code"\n')
  (tmp_path / "activate").write_text(f"export PATH={os.path.dirname(sys.executable)}:$PATH\n")
  env = {**os.environ, "PATH": f"{tmp_path}/bin:{os.environ['PATH']}", "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": xla_flags(1)}
  settings = [f"--set={f[len('--config.'):]}" for f in COMPARABLE_RUNS] + [
      "--set=train.checkpoint_every_steps=2", "--set=train.keep_checkpoints=10",
      "--set=decode.beam_size=1", "--set=data.num_eval_examples=8"]
  out = _launch(f"--experiment={experiment}", "--target=slurm", f"--root={tmp_path}/runs",
                "--smoke", "--nodes=2", "--gpus_per_node=1",
                f"--activate=source {tmp_path}/activate", *settings, env=env)
  assert out.returncode == 0 and "Submitted batch job 7" in out.stdout, out.stderr
  script = (tmp_path / "submitted").read_text().strip()
  workdir = tmp_path / "runs" / "one_smoke" / "base"
  trial = json.loads((workdir / "trial.json").read_text())
  code_dir = tmp_path / "runs" / "one_smoke" / "code" / trial["code"]["fingerprint"]

  def allocation(tasks, restarts, stop=False):
    job = {"SLURM_JOB_ID": str(4000 + os.getpid() % 90), "SLURM_NTASKS": str(tasks),
           "SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_JOB_ID": "7",
           "SLURM_RESTART_COUNT": str(restarts)}
    proc = subprocess.Popen(["bash", script], env={**env, **job}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    while stop and not glob.glob(f"{workdir}/checkpoints/[0-9]*") and proc.poll() is None:
      time.sleep(0.05)
    if stop:
      proc.send_signal(signal.SIGUSR1)
    output = proc.communicate(timeout=600)[0]
    return proc.returncode, output + (code_dir / "task0.log").read_text()

  code, first = allocation(2, 0, stop=True)
  assert code == 75 and "requeueing" in first, first[-3000:]
  assert "process 0 of 2 (SLURM)" in first
  assert (tmp_path / "scontrol.txt").read_text().split() == ["requeue", "7_0"]
  code, second = allocation(1, 1)
  assert code == 0, second[-3000:]
  resumed = re.search(r"resumed from checkpoint at step (\d+)", second)
  assert resumed and int(resumed.group(1)) < 16, second[-3000:]
  assert f"code {trial['code']['fingerprint']} from {code_dir}" in second

  args = [a for a in trial["args"] if not a.startswith("--workdir")]
  whole, control = tmp_path / "whole", tmp_path / "control"
  procs = [*start_training(whole, args), *start_training(control, [*args, ROUNDING_CONTROL])]
  for proc, log in zip(procs, outputs_of(procs)):
    assert proc.returncode == 0, log[-3000:]
  params = lambda run: checkpoint_state(run, 16)["params"]
  assert_within_rounding({"params": max_relative_difference(params(workdir), params(whole))},
                         {"params": max_relative_difference(params(control), params(whole))})


def test_train_minutes_leave_out_the_time_a_trial_was_stopped():
  """Windows of 100 steps at 2 steps/s, a stop of an hour after step 200, then two more
  windows: 4 windows x 50 s of training, not the hour between."""
  from launch import results
  windows = [(100, 2.0, 50.0), (200, 2.0, 100.0), (300, 2.0, 3700.0), (400, 2.0, 3750.0)]
  assert results.train_minutes({"train/steps_per_sec": windows}) == pytest.approx(200 / 60)
  # A resume from step 150's checkpoint logs step 200 again: those steps count once.
  again = windows[:2] + [(200, 2.0, 3650.0)] + windows[2:]
  assert results.train_minutes({"train/steps_per_sec": again}) == pytest.approx(200 / 60)
  assert results.train_minutes({}) is None


def test_results_final_line_is_the_logs_last_test_line_else_results_jsons(tmp_path):
  """A copied worker log's last "Test ..." line wins; a finished run whose logs lack it
  (copied before the line reached them, or a SLURM trial's log beside the experiment)
  gets the line rebuilt from results.json's test scores; a run without them, none."""
  from transformer_jax.training import run_files
  test = {"set": "newstest2014", "sentences": 3003, "averaged": [10, 20], "beam_size": 4,
          "alpha": 0.6, "paper_bleu": 27.31, "bleu": 26.5, "paper": 27.3,
          "paper_row": "base", "signature": "nrefs:1"}
  assert results.final_line(str(tmp_path)) is None
  (tmp_path / "results.json").write_text(json.dumps({"test": test}))
  assert results.final_line(str(tmp_path)) == run_files.test_line(test)
  assert run_files.test_line(test).startswith("Test newstest2014 (3003 sentences; ")
  (tmp_path / "logs").mkdir()
  (tmp_path / "logs" / "base.w0.log").write_text("Test earlier\nstep 20\nTest as logged\n")
  assert results.final_line(str(tmp_path)) == "Test as logged"
  (tmp_path / "results.json").write_text(json.dumps({"test": None}))
  (tmp_path / "logs" / "base.w0.log").write_text("step 20\n")
  assert results.final_line(str(tmp_path)) is None
