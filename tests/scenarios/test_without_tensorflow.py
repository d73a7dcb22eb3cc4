"""The commands run in a Python where `import tensorflow` fails, as on a JAX GPU machine
as it comes; TensorFlow is needed only to prepare or read TFDS datasets (and for gs://
through tf.io.gfile, which gcsfs replaces). The event files they write are read back by
TensorBoard's own loader."""

import ast
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

from conftest import MULTI30K_STANDIN_SIZES, ROOT, multi30k_standin, newstest_standin
from conftest import xla_flags

# Only these files may import TensorFlow or TFDS: the TFDS data sources.
TFDS_MODULES = {"transformer_jax/data/datasets/tfds.py",
                "transformer_jax/data/datasets/multi30k/builder.py"}


def _imports_tensorflow(path: pathlib.Path) -> bool:
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
             [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
    if any(n.split(".")[0] in ("tensorflow", "tensorflow_datasets") for n in names):
      return True
  return False


def test_only_the_tfds_sources_import_tensorflow():
  package = [p for folder in ("transformer_jax", "launch")
             for p in sorted(pathlib.Path(ROOT, folder).rglob("*.py"))]
  importers = {str(p.relative_to(ROOT)) for p in package if _imports_tensorflow(p)}
  assert importers == TFDS_MODULES


@pytest.fixture(scope="module")
def no_tensorflow(tmp_path_factory):
  """An environment whose Python cannot import tensorflow (and finds no spec for it,
  as when it is not installed)."""
  site = tmp_path_factory.mktemp("no_tensorflow")
  (site / "sitecustomize.py").write_text('import sys\nsys.modules["tensorflow"] = None\n')
  env = {**os.environ, "XLA_FLAGS": xla_flags(1),
         "PYTHONPATH": os.pathsep.join([str(site), ROOT, os.environ.get("PYTHONPATH", "")])}
  check = subprocess.run([sys.executable, "-c", "import tensorflow"], env=env,
                         capture_output=True, text=True)
  assert check.returncode != 0 and "ModuleNotFoundError" in check.stderr
  return env


def _run(env, *args, stdin=None):
  out = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, input=stdin,
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  return out


def _events(logdir: pathlib.Path) -> tuple[dict[str, list[tuple[int, float]]], bool]:
  """The scalar plugin's data, {tag: [(step, value)]}, as TensorBoard's event loader
  reads it, and whether the hyperparameters are there."""
  from tensorboard.backend.event_processing import event_accumulator as ea
  from tensorboard.util import tensor_util
  acc = ea.EventAccumulator(str(logdir), size_guidance={ea.TENSORS: 0})
  acc.Reload()
  scalars = {tag: [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
                   for e in acc.Tensors(tag)]
             for tag in acc.PluginTagToContent("scalars")}
  hparams = "_hparams_/session_start_info" in acc.Tags()["tensors"]
  return scalars, hparams


def test_multi30k_from_its_plain_files_needs_no_tensorflow(no_tensorflow, tmp_path):
  """data.manual_dir with Multi30k's six files: read as text files, without TFDS."""
  sums = multi30k_standin(tmp_path)
  code = ("import json, sys; from transformer_jax.data import corpora; "
          "from transformer_jax.data.datasets.multi30k import release; "
          f"release.sha256 = lambda: {sums!r}; "
          "from transformer_jax.config import DataConfig; "
          f"cfg = DataConfig(task='multi30k', manual_dir={str(tmp_path)!r}); "
          "corpora.corpus(cfg).check_available(); "
          "print(*(len(corpora.corpus(cfg).split(s)[0]) for s in ('train', 'eval', 'test')))")
  out = subprocess.run([sys.executable, "-c", code], env=no_tensorflow, cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.split() == [str(MULTI30K_STANDIN_SIZES[s])
                                for s in ("train", "val", "test_2016_flickr")]


@pytest.mark.slow
def test_train_translate_evaluate_export_benchmark_and_launch_without_tensorflow(
    no_tensorflow, tmp_path):
  env = no_tensorflow
  experiment = tmp_path / "one.py"
  experiment.write_text('"""One smoke trial."""\nfrom launch import sweep\n'
                        'CONFIG = "configs/transformer.py:numbers"\n'
                        'def trials():\n  return sweep.grid({"train.seed": [0]})\n')
  root = tmp_path / "runs"
  _run(env, "launch", f"--experiment={experiment}", f"--root={root}", "--smoke")
  workdir = root / "one_smoke" / "seed=0"
  assert json.loads((workdir / "results.json").read_text())["step"] == 20

  scalars, hparams = _events(workdir)
  assert {"train/loss", "train/learning_rate", "eval/loss", "eval/bleu"} <= set(scalars)
  assert [step for step, _ in scalars["train/loss"]] == [5, 10, 15, 20]
  assert scalars["eval/loss"][-1][1] < scalars["train/loss"][0][1]
  assert hparams  # The run's config, for TensorBoard's HPARAMS tab.

  report = _run(env, "launch.results", f"--experiment={experiment}", f"--root={root}",
                "--smoke", "--sort=eval/loss")
  assert "seed=0" in report.stdout

  out = _run(env, "transformer_jax.translate", f"--workdir={workdir}",
             stdin="thirty-four and seven\n\nfive\n")
  assert len(out.stdout.split("\n")) == 4 and out.stdout.split("\n")[1] == ""

  out = _run(env, "transformer_jax.evaluate", f"--workdir={workdir}", "--split=test")
  assert "sacreBLEU" in out.stdout
  evaluated, _ = _events(workdir / "evaluate")
  assert {"test/bleu", "test/paper_bleu"} <= set(evaluated)

  _run(env, "transformer_jax.export", f"--workdir={workdir}", f"--output={tmp_path / 'ct2'}")
  assert (tmp_path / "ct2" / "model.bin").exists()

  out = _run(env, "transformer_jax.benchmark", f"--workdir={workdir}", "--repeats=1")
  assert "sentences/s" in out.stdout
  newstest = newstest_standin(tmp_path / "newstest")
  out = _run(env, "transformer_jax.benchmark", "--config=configs/transformer.py:numbers,smoke",
             "--config.data.vocab_size=500", "--steps=2", "--decode_sentences=8",
             f"--newstest_dir={newstest}")
  assert "non-pad target tokens/s" in out.stdout and "sentences/s" in out.stdout


@pytest.mark.skipif(importlib.util.find_spec("gcsfs") is not None,
                    reason="gcsfs is installed")
def test_a_gs_path_without_a_filesystem_for_it_names_the_extra_at_once(no_tensorflow,
                                                                       tmp_path):
  """Neither TensorFlow nor gcsfs: one line naming what to install, before any network
  is asked (none is reachable here)."""
  out = subprocess.run([sys.executable, "-m", "transformer_jax.main",
                        "--config=configs/transformer.py:numbers,smoke",
                        "--workdir=gs://bucket/run"], cwd=ROOT, env=no_tensorflow,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 2, out.stderr[-3000:]
  assert out.stderr.strip().splitlines()[-1].startswith(
      "error: --workdir=gs://bucket/run: no filesystem for gs:// is installed"), out.stderr
  assert "pip install gcsfs (pip install -e '.[tpu]' brings it)" in out.stderr
  assert "Traceback" not in out.stderr
