"""Searches sized to the hardware (launch/search_space.py's trial_devices and
device_hours): a trial over several SLURM nodes as one JAX run, several trials sharing
a node on devices of their own, a TPU trial a whole TPU, and a budget in device-hours
that stops a search starting trials."""

import os
import re
import shlex
import subprocess
import sys

import optuna
import pytest

from conftest import ROOT
from launch import search, study as study_lib, sweep, trial_lease
from launch.targets import slurm


def _code(tmp_path, trials=2, **options) -> tuple:
  """A working tree of symlinks to this one whose experiment tiny_search is a
  search on the numbers task with `options` (a SLURM search runs its experiment from
  the code it ships), and a bin/ with `python` (the job's) first on PATH."""
  code = tmp_path / "code"
  (code / "experiments").mkdir(parents=True)
  for name in ("launch", "transformer_jax", "configs", "pyproject.toml"):
    (code / name).symlink_to(os.path.join(ROOT, name))
  settings = {"trials": trials, "pruner": '"none"', "seed": 0, **options}
  (code / "experiments" / "tiny_search.py").write_text(
      '"""A tiny search."""\nfrom launch import search\n'
      'CONFIG = "configs/transformer.py:numbers"\n'
      'SEARCH = search.Search(space={"model.dropout_rate": search.uniform(0.0, 0.3)}, '
      + ", ".join(f"{k}={v}" for k, v in settings.items()) + ")\n")
  bin_ = tmp_path / "bin"
  bin_.mkdir()
  (bin_ / "python").write_text(f'#!/bin/bash\nexec {sys.executable} "$@"\n')
  (bin_ / "python").chmod(0o755)
  return code, bin_


def test_a_trial_takes_whole_nodes_or_a_share_of_one_and_nothing_between():
  """On nodes of 8: 16 devices a trial is 2 nodes; 1, 2, 4 share a node 8, 4, 2 at a
  time; None is a node. A size that is neither a divisor nor a multiple of a node, and
  bad values of either setting, are refused in one line naming the valid ones."""
  space = {"model.dropout_rate": search.uniform(0.0, 0.3)}
  sizes = {size: search.Search(space, trial_devices=size).placement(8)
           for size in (None, 1, 2, 4, 8, 16, 24)}
  assert sizes == {None: (1, 1), 1: (1, 8), 2: (1, 4), 4: (1, 2), 8: (1, 1),
                   16: (2, 1), 24: (3, 1)}
  for size in (3, 12):
    with pytest.raises(ValueError, match=f"trial_devices={size} on nodes of 8 devices: .* "
                       "valid: 1, 2, 4, 8, 16, 32"):
      search.Search(space, trial_devices=size).placement(8)
  assert search.Search(space, trial_devices=2, device_hours=10.0).problems() == []
  for bad in (0, -2, 1.5, True):
    [problem] = search.Search(space, trial_devices=bad).problems()
    assert problem.startswith(f"trial_devices={bad!r}: a whole number of devices, at least 1")
  for bad in (0, -1.0):
    [problem] = search.Search(space, device_hours=bad).problems()
    assert problem.startswith(f"device_hours={bad}: above 0")


def test_a_slurm_searchs_tasks_span_the_trials_nodes_or_share_a_node_among_launchers(
    tmp_path, monkeypatch, capsys):
  """The sbatch script: 16 devices a trial on nodes of 8 is an array task of 2 nodes, 8
  tasks each, whose one launcher starts each trial with srun; 2 a trial is a task of 1
  node with 4 launchers, each given 2 of SLURM's GPUs of its own, the 6 trials' budget
  in 2 tasks; a size that fits no node is refused in one line."""
  code, _ = _code(tmp_path, trials=6)

  def script(size, gpus_per_node=8):
    (code / "experiments" / "sized.py").write_text(
        (code / "experiments" / "tiny_search.py").read_text().replace(
            "seed=0", f"seed=0, trial_devices={size}"))
    experiment = sweep.load_experiment("experiments/sized.py")
    return slurm.search_script(experiment, "/shared/runs", "journal:/shared/s.journal", [],
                               False, str(code), gpus_per_node, None)

  monkeypatch.chdir(code)
  wide = script(16)
  header = dict(re.findall(r"^#SBATCH --([\w-]+)=(.*)$", wide, re.M))
  assert (header["array"], header["nodes"], header["ntasks-per-node"]) == ("0-5", "2", "8")
  [launcher] = [line for line in wide.splitlines() if line.endswith(" & RUNS+=($!)")]
  assert shlex.split(launcher)[:3] == ["python", "-m", "launch"] and " --srun " in launcher
  shared = script(2)
  header = dict(re.findall(r"^#SBATCH --([\w-]+)=(.*)$", shared, re.M))
  assert (header["array"], header["nodes"], header["ntasks-per-node"],
          header["gpus-per-node"]) == ("0-1", "1", "1", "8")
  assert 'GPUS="${CUDA_VISIBLE_DEVICES:-0,1,2,3,4,5,6,7}"' in shared.splitlines()
  launchers = [line for line in shared.splitlines() if line.endswith(" & RUNS+=($!)")]
  slices = ["1-2", "3-4", "5-6", "7-8"]
  assert [line.split(" python ")[0] for line in launchers] == [
      f'CUDA_VISIBLE_DEVICES="$(cut -d, -f{s} <<< "$GPUS")"' for s in slices]
  assert all("--srun" not in line for line in launchers)
  for fields, want in zip(slices, ("0,1", "2,3", "4,5", "6,7")):
    cut = subprocess.run(["cut", "-d,", f"-f{fields}"], input="0,1,2,3,4,5,6,7\n",
                         capture_output=True, text=True).stdout.strip()
    assert cut == want
  described = search.describe(sweep.load_experiment("experiments/sized.py"))
  assert described.startswith("# search: 6 trials by tpe") and (
      "; 2 devices a trial\n" in described)
  with pytest.raises(SystemExit) as exit_:
    script(3)
  [line] = capsys.readouterr().err.splitlines()
  assert exit_.value.code == 2 and line.startswith(
      "error: experiments/sized.py: SEARCH trial_devices=3 on nodes of 8 devices: a trial "
      "takes a share of one node or whole nodes; valid: 1, 2, 4, 8, 16, 32, ...")


def test_the_device_hours_budget_stops_new_trials_and_lets_started_ones_end(
    tmp_path, monkeypatch):
  """Each launcher records its trial's devices x wall time before telling how it ended,
  added up over resumptions; once the ended trials' device-hours reach
  Search.device_hours, next_trial starts no new trial, but a started one goes on to its
  end (a failed one retried as itself, never left RUNNING); a trial added from
  elsewhere costs nothing. launch.results says what is spent."""
  spec = search.Search({"model.dropout_rate": search.uniform(0.0, 0.3)}, trials=10,
                       device_hours=1.0)
  monkeypatch.setattr(trial_lease, "SETTLE_S", 0.0)
  study = optuna.create_study()
  seen = trial_lease.Seen()
  added = optuna.trial.create_trial(params={"model.dropout_rate": 0.1}, value=1.0,
                                    distributions=spec.distributions(),
                                    user_attrs={"warm_start": "grid", "name": "g",
                                                "device_seconds": 1e9})
  study.add_trial(added)
  first, held = search.next_trial(study, spec, seen)
  search.spend(first, 1, 2, 600.0, "here")  # Killed, then resumed: 2 x (600 + 1199) s.
  search.spend(first, 1, 2, 1199.0, "there")
  assert first.user_attrs["devices"] == 2 and first.user_attrs["where"] == "there"
  held.release()  # It failed: released, to be trained again as itself.
  retry, held = search.next_trial(study, spec, seen)  # 0.999 device-hours: it resumes.
  assert retry.number == first.number
  search.spend(retry, 1, 2, 1.0, "here")
  held.release()  # It failed again: 1.0 of 1.0 device-hours spent.
  trials = study.get_trials()
  assert search.device_hours(trials) == pytest.approx(1.0)
  assert search.spent(trials, spec) == (
      "budget: 1 of 10 trials, 1 of 1 device-hours spent (the device-hours are spent: no "
      "trial starts)")
  again, held = search.next_trial(study, spec, seen)  # Started before: it ends.
  assert again.number == first.number
  study.tell(again, 1.0)
  held.release()
  assert search.next_trial(study, spec, seen) is None  # Nothing new starts.
  assert [t.state.name for t in study.get_trials()] == ["COMPLETE", "COMPLETE"]
  unlimited = search.Search(spec.space, trials=10)
  assert search.spent(study.get_trials(), unlimited) == (
      "budget: 1 of 10 trials, 1 device-hours spent")
  assert search.next_trial(study, unlimited, seen)[0].number == 2


def _slurm_search(code, root, gpus_per_node: int, env) -> None:
  """Launches tiny_search on SLURM through the stand-in sbatch (10 smoke steps a trial)
  and waits for its array job to end."""
  out = subprocess.run(
      [sys.executable, "-m", "launch", "--experiment=experiments/tiny_search.py",
       "--target=slurm", f"--slurm_bin={ROOT}/launch/slurm_standin", f"--root={root}",
       "--noship", f"--repo_dir={code}", f"--gpus_per_node={gpus_per_node}", "--smoke",
       "--set=train.max_length_buckets=1", "--set=train.num_train_steps=10",
       "--set=train.final_test=false"],
      cwd=code, capture_output=True, text=True, timeout=900, env=env)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


@pytest.mark.slow
def test_a_slurm_search_trains_a_trial_on_two_nodes_as_one_jax_run(tmp_path):
  """trial_devices=2 on nodes of 1 GPU, through the stand-in sbatch (its nodes: folders
  and processes here): the array task asks for 2 nodes, its launcher trains the trial
  with srun as 2 processes, one a node, that form one JAX run of 2; the study records
  2 hosts and 2 devices for it."""
  code, bin_ = _code(tmp_path, trials=1, trial_devices=2)
  root = tmp_path / "runs"
  env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "CUDA_VISIBLE_DEVICES": "0",
         "JAX_PLATFORMS": "cpu"}
  _slurm_search(code, root, 1, env)
  folder = root / "tiny_search_smoke"
  script = (folder / "sbatch.sh").read_text()
  assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=1" in script
  for task in (0, 1):
    [log] = folder.glob(f"slurm-*_0.out.node{task}.task{task}")
    assert f"process {task} of 2 (SLURM)" in log.read_text(), log.read_text()[-2000:]
  study = study_lib.open_study(sweep.load_experiment(str(code / "experiments/tiny_search.py")),
                               f"journal:{folder / 'study.journal'}", create=False)
  [trial] = study.get_trials()
  assert trial.state.name == "COMPLETE", trial
  assert (trial.user_attrs["hosts"], trial.user_attrs["devices"]) == (2, 2)
  assert trial.user_attrs["device_seconds"] > 0


@pytest.mark.slow
def test_a_slurm_search_trains_two_trials_at_once_on_one_node_each_on_its_own_device(
    tmp_path):
  """trial_devices=1 on nodes of 2 GPUs, through the stand-in sbatch: one array task
  (one node) runs 2 launchers at once, each given one GPU of its own; each takes one
  trial of the budget's 2, and they train at the same time."""
  code, bin_ = _code(tmp_path, trials=2, trial_devices=1)
  root = tmp_path / "runs"
  env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "JAX_PLATFORMS": "cpu"}
  env.pop("CUDA_VISIBLE_DEVICES", None)
  _slurm_search(code, root, 2, env)
  folder = root / "tiny_search_smoke"
  assert "#SBATCH --array=0-0" in (folder / "sbatch.sh").read_text()
  study = study_lib.open_study(sweep.load_experiment(str(code / "experiments/tiny_search.py")),
                               f"journal:{folder / 'study.journal'}", create=False)
  trials = study.get_trials()
  assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"], trials
  assert sorted(t.user_attrs["where"].rsplit("=", 1)[1] for t in trials) == ["0", "1"]
  assert [t.user_attrs["devices"] for t in trials] == [1, 1]
  first, second = trials
  assert first.datetime_start < second.datetime_complete
  assert second.datetime_start < first.datetime_complete  # At once.


def test_a_tpu_trial_is_a_whole_tpu_of_the_searchs_size(tmp_path):
  """On TPUs each trial gets a TPU of its own: a trial_devices that --accelerator_type
  does not have is refused in one line that names a type of that size."""
  experiment = tmp_path / "sized.py"
  experiment.write_text('"""A search of 16-chip trials."""\nfrom launch import search\n'
                        'CONFIG = "configs/transformer.py:numbers"\n'
                        'SEARCH = search.Search(space={"model.dropout_rate": '
                        'search.uniform(0.0, 0.3)}, trial_devices=16)\n')
  out = subprocess.run(
      [sys.executable, "-m", "launch", f"--experiment={experiment}", "--target=tpu",
       "--tpu_name=t", "--zone=us-east5-a", "--accelerator_type=v5p-8",
       "--root=gs://bucket/runs", "--storage=sqlite:///x.db", "--dry_run",
       "--skip_fit_check", "--noship", "--repo_dir=/code"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
  assert ("SEARCH trial_devices=16, but each trial here gets a TPU of its own, and a v5p-8 "
          "has 4 chips: give a type of 16 chips (e.g. --accelerator_type=v5p-32)"
          ) in out.stderr
