"""docs/extending.md's examples work as written: each section's module, copied into a
copy of the repository at the path its first line names, and its command, run from
that copy's root."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

DOC = os.path.join(ROOT, "docs", "extending.md")


def example(section: str) -> tuple[str, str, str]:
  """The section's module (its path and text) and the bash command that uses it."""
  with open(DOC, encoding="utf-8") as f:
    text = f.read().split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
  [module] = re.findall(r"```python\n# file: (\S+)\n(.*?)```", text, re.S)
  [command] = re.findall(r"```bash\n(.*?)```", text, re.S)
  return module[0], f"# file: {module[0]}\n{module[1]}", command


def run_example(tmp_path, section: str, timeout: float = 600) -> subprocess.CompletedProcess:
  """Copies the repository's tracked files to tmp_path/repo, adds the section's module
  and runs its command there with this Python first on PATH; returns what it printed."""
  path, module, command = example(section)
  files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                         check=True).stdout.decode().split("\0")
  repo = tmp_path / "repo"
  for name in filter(None, files):
    if os.path.exists(os.path.join(ROOT, name)):
      os.makedirs(repo / os.path.dirname(name), exist_ok=True)
      shutil.copy(os.path.join(ROOT, name), repo / name)
  assert not (repo / path).exists(), f"{path} is already in the repository"
  (repo / path).write_text(module)
  if os.path.isdir(os.path.join(ROOT, "..", "shared")):
    os.symlink(os.path.join(ROOT, "..", "shared"), tmp_path / "shared")
  env = {**os.environ, "PYTHONPATH": str(repo),
         "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
  return subprocess.run(["bash", "-c", command], cwd=repo, env=env, capture_output=True,
                        text=True, timeout=timeout)


def test_a_dataset_is_one_module_that_trains_and_has_its_test_split_scored(tmp_path):
  """docs/extending.md's toy dataset, copied into data/datasets/ and named by one
  override: the numbers smoke config trains on its 620 pairs and holds out its 40, and
  its 60 test pairs are scored, by name, in the run's last line and by `evaluate`."""
  out = run_example(tmp_path, "A dataset")
  assert out.returncode == 0, out.stderr[-3000:]
  assert "task toy: 620 train / 40 held-out pairs" in out.stderr, out.stderr[-3000:]
  assert re.search(r"^Test toy_test \(60 sentences; .*sacreBLEU \d", out.stdout, re.M), \
      out.stdout[-3000:]
  assert re.search(r"^test: 60 sentences, .*\n  sacreBLEU \d", out.stdout, re.M), \
      out.stdout[-3000:]


@pytest.mark.slow  # Two smoke runs (about a minute), as the local sweep's own test.
def test_a_launch_target_is_one_module_and_runs_the_trials_it_is_named_for(tmp_path):
  """The section's target, named by --target only, is the one that ran each trial: its
  own line and its `nice` command for each, and each trial finished (results.json)."""
  out = run_example(tmp_path, "A launch target")
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
  assert "# numbers_grid: 2 trials, target my_local\n" in out.stdout, out.stdout[:2000]
  for rate in ("0.1", "10.0"):
    name = f"learning_rate_multiplier={rate},warmup_steps=50,dropout_rate=0.0"
    assert f"# my_local: {name} at niceness 10\n" in out.stdout, out.stdout[-3000:]
    assert re.search(rf"^nice -n 10 \S+ -m transformer_jax\.main .*"
                     rf"--workdir=runs/numbers_grid_smoke/{re.escape(name)} ",
                     out.stdout, re.M), out.stdout[-3000:]
    assert (tmp_path / "repo" / "runs" / "numbers_grid_smoke" / name / "results.json").exists()


def test_an_attention_implementation_is_one_module_selected_by_config(tmp_path):
  """The example's module, copied in, is a valid model.attention_implementation: the
  smoke run trains to its last step with the example's `attend` computing every
  attention layer it compiles, and records the name in its config."""
  run = run_example(tmp_path, "An attention implementation")
  assert run.returncode == 0, run.stderr[-3000:]
  used = [line for line in run.stdout.splitlines() if line.startswith("my_xla: attention")]
  assert len(used) >= 3, run.stdout[-3000:]  # Encoder, decoder and cross-attention.
  assert "step 20 of 20 (100%)" in run.stderr, run.stderr[-3000:]
  workdir = tmp_path / "repo" / "runs" / "my_xla"
  config = json.loads((workdir / "config.json").read_text())
  assert config["model"]["attention_implementation"] == "my_xla"
  assert (workdir / "results.json").exists()
