"""The offline bundle: built here, then run in a virtualenv that holds only what the
stock JAX GPU image holds, with no package index reachable."""

import importlib.metadata
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT
from launch import bundle

SHARED_NEWSTEST = os.path.join(ROOT, "..", "shared", "data", "newstest2014")


def _dependency_closure(name: str) -> set[str]:
  """Normalized names of `name`'s installed dependencies, recursively (no extras)."""
  seen, todo = set(), [name]
  while todo:
    for line in importlib.metadata.distribution(todo.pop()).requires or []:
      requirement, _, marker = line.partition(";")
      dependency = re.match(r"[A-Za-z0-9._-]+", requirement.strip()).group()
      key = bundle.normalize(dependency)
      if "extra" in marker or key in seen:
        continue
      try:  # A marker for another platform or Python: not installed, not needed.
        importlib.metadata.distribution(dependency)
      except importlib.metadata.PackageNotFoundError:
        continue
      seen.add(key)
      todo.append(dependency)
  return seen


def image_virtualenv(directory, image: str = "jax-gpu") -> str:
  """A new virtualenv whose site-packages reaches, through links, exactly the project's
  dependencies (recursively) that `image` lists, taken from this environment: nothing
  downloaded. Returns its python."""
  subprocess.run([sys.executable, "-m", "venv", str(directory / "venv")], check=True)
  python = str(directory / "venv" / "bin" / "python")
  site = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"],
                        check=True, capture_output=True, text=True).stdout.strip()
  names, _ = bundle.read_image(image)
  wanted = _dependency_closure("transformer-jax") & names
  linked = directory / "image_site"
  linked.mkdir()
  found = set()
  for dist in importlib.metadata.distributions():
    key = bundle.normalize(dist.metadata["Name"])
    if key not in wanted or key in found:
      continue
    found.add(key)
    for top in {f.parts[0] for f in dist.files or [] if f.parts[0] != ".."}:
      if not (linked / top).exists() and os.path.exists(dist.locate_file(top)):
        os.symlink(dist.locate_file(top), linked / top)
  assert wanted == found, wanted - found
  with open(os.path.join(site, "image.pth"), "w") as f:
    f.write(str(linked) + "\n")
  return python


@pytest.mark.parametrize("module", ["benchmark", "evaluate", "train"])
def test_paper_bleu_alone_needs_sacremoses(module):
  """Commands import sacremoses only when they compute the paper's tokenized BLEU."""
  code = (f"import sys, transformer_jax.{module}; "
          "assert 'sacremoses' not in sys.modules")
  subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_the_image_list_names_what_the_gpu_machine_lacks():
  names, python = bundle.read_image("jax-gpu")
  assert python == "3.12" and {"jax", "flax", "optax", "orbax-checkpoint"} <= names
  assert not {"ml-collections", "sacremoses", "tensorflow", "clu"} & names


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(SHARED_NEWSTEST), reason="needs ../shared/data")
def test_bundle_runs_the_quick_suite_offline_in_the_images_environment(tmp_path):
  """`launch.bundle --image=jax-gpu` carries the wheels the image lacks; in a virtualenv
  of the image's packages alone, with every package index unreachable, `run.sh --quick`
  installs them and writes results.json with both jobs' figures and a profile."""
  out = tmp_path / "bundle"
  built = subprocess.run(
      [sys.executable, "-m", "launch.bundle", f"--output={out}", "--image=jax-gpu",
       f"--newstest_dir={SHARED_NEWSTEST}", "--python_version=%d.%d" % sys.version_info[:2]],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert built.returncode == 0, built.stderr[-3000:]
  wheels = json.loads((out / "bundle.json").read_text())["wheels"]
  assert any(w.startswith("ml_collections-") for w in wheels)
  assert any(w.startswith("sacremoses-") for w in wheels)
  assert not any(re.match(r"(jax|jaxlib|flax|numpy)-", w) for w in wheels), wheels

  python = image_virtualenv(tmp_path)
  missing = subprocess.run([python, "-c", "import ml_collections"], capture_output=True)
  assert missing.returncode != 0  # The image lacks it; only the bundle brings it.
  offline = {k: v for k, v in os.environ.items()
             if not k.startswith(("PIP_", "PYTHONPATH", "VIRTUAL_ENV"))}
  offline.update(PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_FIND_LINKS="",
                 https_proxy="http://127.0.0.1:9", http_proxy="http://127.0.0.1:9",
                 XLA_FLAGS="--xla_force_host_platform_device_count=1")
  run = subprocess.run(["bash", str(out / "run.sh"), "--quick", f"--python={python}"],
                       env=offline, capture_output=True, text=True, timeout=900)
  assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
  results = json.loads((out / "out" / "results.json").read_text())
  assert set(results["jobs"]) == {"base", "big"}
  for job in results["jobs"].values():
    for key in ("device_kind", "jax_version", "tokens_per_s", "step_s",
                "real_token_fraction", "mfu", "mfu_computed", "peak_memory_gib"):
      assert job.get(key) is not None, (key, job)
  assert results["jobs"]["base"]["decode_sentences"] == 32
  assert results["jobs"]["base"]["top_ops"]
  assert (out / "out" / "log.txt").exists() and (out / "out" / "profile").is_dir()
