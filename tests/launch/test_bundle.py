"""The offline bundle: built here, then run in a virtualenv that holds only what the
stock JAX GPU image holds, with no package index reachable."""

import glob
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, SHARED_DATA, TWO_LAYER_FLAGS, newstest_standin, xla_flags
from launch import bundle
from transformer_jax.benchmarks import suite

SHARED_NEWSTEST = os.path.join(SHARED_DATA, "newstest2014")
SHARED_MULTI30K = os.path.join(SHARED_DATA, "multi30k")


@pytest.mark.parametrize("module", ["benchmark", "evaluate", "training.loop"])
def test_paper_bleu_alone_needs_sacremoses(module):
  """Commands import sacremoses only when they compute the paper's tokenized BLEU."""
  code = (f"import sys, transformer_jax.{module}; "
          "assert 'sacremoses' not in sys.modules")
  subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_the_image_list_names_what_the_gpu_machine_lacks():
  names, python = bundle.read_image("jax-gpu")
  assert python == "3.12" and {"jax", "flax", "optax", "orbax-checkpoint"} <= names
  assert not {"ml-collections", "sacremoses", "tensorflow", "clu"} & names


def test_run_sh_without_a_python_that_imports_jax_says_so_in_one_line(tmp_path):
  """run.sh tries /opt/torch/.venv/bin/python3 (the GPU image's), then python3; when
  neither imports jax it names what it tried and how to choose (exit 2)."""
  (tmp_path / "run.sh").write_text(bundle.RUN_SH)
  no_jax = tmp_path / "bin"
  no_jax.mkdir()
  (no_jax / "python3").write_text("#!/bin/sh\nexit 1\n")  # Imports nothing.
  (no_jax / "python3").chmod(0o755)
  env = {"PATH": f"{no_jax}:/usr/bin:/bin", "HOME": str(tmp_path)}
  out = subprocess.run(["bash", str(tmp_path / "run.sh"), "--quick"], env=env,
                       capture_output=True, text=True, timeout=60)
  assert out.returncode == 2, out.stderr
  assert out.stderr.strip().splitlines() == [
      "run.sh: no Python here imports jax (tried /opt/torch/.venv/bin/python3, python3); "
      "name one with --python=PATH or PYTHON=PATH"]


# A stand-in Python for run.sh: imports jax, "installs" by writing who made the folder, and
# as a module run reports which install it runs from. $SYNC holds the files that order two
# run.sh calls deterministically.
_STANDIN_PYTHON = r"""#!/usr/bin/env bash
wait_for() { for _ in $(seq 600); do [ -e "$1" ] && return; sleep 0.05; done; exit 9; }
[ "$1" = -c ] && { case "$2" in *print*) echo "Python 3.12.1 JAX 0.11.2";; esac; exit 0; }
if [ "$2" = pip ]; then
  while [ "$1" != --target ]; do shift; done
  echo "$ROLE" > "$2/made_by"
  if [ "$ROLE" = A ]; then wait_for "$SYNC/b_installing"
  else touch "$SYNC/b_installing"; wait_for "$SYNC/a_running"; fi
  exit 0
fi
site="${PYTHONPATH#*:}"; site="${site%%:*}"
if [ "$ROLE" = A ]; then
  cat "$site/made_by" > "$SYNC/a_saw"; touch "$SYNC/a_running"; wait_for "$SYNC/b_done"
  cat "$site/made_by" >> "$SYNC/a_saw"
else
  cat "$site/made_by" > "$SYNC/b_saw"; touch "$SYNC/b_done"
fi
"""


def test_two_run_sh_installing_at_once_never_remove_the_site_the_other_runs_from(tmp_path):
  """Two run.sh started at once (trials side by side) both install the wheels: each into a
  folder of its own, renamed into site/; the first rename wins, and nothing ever removes
  a site/ (the other may be running from it). Ordered by files, not timing: A installs
  only once B is installing, B finishes only once A runs from site/. A site/ that run.sh
  did not make is refused in one line and kept."""
  (tmp_path / "run.sh").write_text(bundle.RUN_SH)
  (tmp_path / "code").mkdir()
  (tmp_path / "wheels").mkdir()
  (tmp_path / "wheels" / "x-1-py3-none-any.whl").write_text("")
  bin_dir, sync = tmp_path / "bin", tmp_path / "sync"
  bin_dir.mkdir()
  sync.mkdir()
  (bin_dir / "python3").write_text(_STANDIN_PYTHON)
  # Every rm run.sh calls is logged, then done.
  (bin_dir / "rm").write_text(f'#!/bin/sh\necho "$@" >> {sync}/rm.log\nexec /bin/rm "$@"\n')
  for tool in ("python3", "rm"):
    (bin_dir / tool).chmod(0o755)
  env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "SYNC": str(sync)}
  runs = {role: subprocess.Popen(["bash", str(tmp_path / "run.sh"), "-m", "x"],
                                 env={**env, "ROLE": role}, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
          for role in "AB"}
  for role, run in runs.items():
    log = run.communicate(timeout=120)[0]
    assert run.returncode == 0, (role, log)
  assert (sync / "a_saw").read_text().split() == ["A", "A"]  # Its site/ stayed.
  assert (sync / "b_saw").read_text().split() == ["A"]  # B runs from the winner's.
  removed = (sync / "rm.log").read_text().split()
  assert str(tmp_path / "site") not in removed, removed  # Only B's own folder went.
  assert not glob.glob(str(tmp_path / ".site.*"))

  shutil.rmtree(tmp_path / "site")
  (tmp_path / "site").mkdir()
  (tmp_path / "site" / "mine").write_text("kept")
  out = subprocess.run(["bash", str(tmp_path / "run.sh"), "-m", "x"],
                       env={**env, "ROLE": "B"}, capture_output=True, text=True, timeout=60)
  assert out.returncode == 2, out.stderr
  assert out.stderr.strip().splitlines()[-1] == (
      f"run.sh: {tmp_path / 'site'} was not made by run.sh (no .installed in it); remove it "
      "and run again")
  assert (tmp_path / "site" / "mine").read_text() == "kept"


def _suite(out, *flags, **popen):
  env = {**os.environ, "XLA_FLAGS": xla_flags(1),
         "JAX_COMPILATION_CACHE_DIR": str(out.parent / "jax_cache")}
  return subprocess.Popen(
      [sys.executable, "-m", "transformer_jax.benchmarks.suite", "--quick", f"--out={out}",
       f"--newstest_dir={newstest_standin(out.parent / 'news')}", *flags],
      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
      **popen)


def test_a_bundle_carried_inside_a_checkout_reports_the_revision_it_was_built_from(
    tmp_path):
  """On a lent machine the bundle travels inside the carried working tree: the figures
  must name the bundle's revision (bundle.json), not that checkout's HEAD."""
  checkout = tmp_path / "checkout"
  code = checkout / "build" / "before" / "code"
  code.mkdir(parents=True)
  git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@t"]
  subprocess.run([*git, "init", "-q"], check=True)
  subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "later"], check=True)
  (code.parent / "bundle.json").write_text(json.dumps({"revision": "0ae7261"}))
  assert suite.code_record(str(code))["revision"] == "0ae7261"
  head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
  assert suite.code_record(str(checkout))["revision"] == head.stdout.strip()


def _results(out) -> dict:
  return json.loads((out / "results.json").read_text())


@pytest.mark.slow
def test_a_suite_killed_half_way_keeps_every_phase_that_finished(tmp_path):
  """kill -9 of the suite and its job while big runs (a time limit's last word):
  results.json keeps base's figures and the phases big had finished."""
  out = tmp_path / "out"
  proc = _suite(out, start_new_session=True)
  deadline, job = time.time() + 600, out / "jobs" / "big.json"
  while time.time() < deadline and proc.poll() is None:  # Until big has compiled.
    time.sleep(0.2)
    if job.exists() and "compile" in json.loads(job.read_text())["phases"]:
      time.sleep(1)  # The suite reads big's next line, then writes results.json.
      break
  os.killpg(proc.pid, signal.SIGKILL)
  log, _ = proc.communicate(timeout=120)
  assert proc.returncode == -signal.SIGKILL, log[-3000:]
  results = _results(out)
  base, big = results["jobs"]["base"], results["jobs"]["big"]
  assert {p["status"] for p in base["phases"].values()} == {"ok"}, base["phases"]
  assert base["tokens_per_s"] > 0 and base["peak_memory_gib"] > 0 and base["exit"] == 0
  assert big["phases"]["compile"]["status"] == "ok" and "exit" not in big, big
  assert "decode" not in results["jobs"] and "ended" not in results
  for key in ("started", "command", "code", "environment"):
    assert results[key], key


@pytest.mark.slow
def test_a_job_whose_cudnn_attention_fails_is_measured_again_with_xla_attention(tmp_path):
  """cuDNN attention cannot compile on a CPU: the job records why, then measures with
  XLA's attention; --jobs runs the named jobs alone."""
  out = tmp_path / "out"
  proc = _suite(out, "--jobs=base", "--attention=cudnn")
  log, _ = proc.communicate(timeout=600)
  assert proc.returncode == 0, log[-3000:]
  results = _results(out)
  assert list(results["jobs"]) == ["base"]
  base = results["jobs"]["base"]
  assert base["attention"] == "xla" and base["tokens_per_s"] > 0
  errors = [p["error"] for p in base["cudnn_failure"]["phases"].values()
            if p["status"] == "error"]
  assert errors and "cudnn" in errors[0].lower(), base["cudnn_failure"]


@pytest.mark.slow
def test_the_gpu_calls_kernels_on_job_runs_and_names_the_kernels_it_measured(tmp_path):
  """docs/scaling.md's GPU call, dry: the suite's --kernels=norm,ffn,hybrid,unmerged,stacked
  runs base and its profile with this project's Pallas kernels (interpreted on this
  CPU), the dot merger off and stacked layers, and each job's figures name the options
  they measured; the profile runs without command buffers."""
  out = tmp_path / "out"
  proc = _suite(out, "--jobs=base,profile", "--kernels=norm,ffn,hybrid,unmerged,stacked")
  log, _ = proc.communicate(timeout=900)
  assert proc.returncode == 0, log[-3000:]
  jobs = _results(out)["jobs"]
  assert list(jobs) == ["base", "profile"]
  assert {(job["loss_kernel"], job["norm_kernel"], job["ffn_kernel"], job["dot_merger"],
           job["scan_layers"]) for job in jobs.values()} == {
               ("hybrid", "pallas", "pallas", False, True)}
  # The profile's trace names each kernel's instruction: no command buffers there.
  assert suite.PROFILE_XLA_FLAGS in jobs["profile"]["xla_flags"].split()
  assert suite.PROFILE_XLA_FLAGS not in jobs["base"]["xla_flags"].split()
  assert jobs["base"]["tokens_per_s"] > 0
  assert {p["status"] for p in jobs["profile"]["phases"].values()} == {"ok"}


def _python_312() -> str | None:
  """A Python 3.12 that runs: pyenv's, or python3.12 on PATH (a pyenv shim on PATH may
  name a version that is not selected, and fail)."""
  candidates = [*sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12")),
                        reverse=True), shutil.which("python3.12")]
  for python in filter(None, candidates):
    if subprocess.run([python, "-c", "pass"], capture_output=True).returncode == 0:
      return python
  return None


@pytest.fixture(scope="module")
def image_python() -> tuple[str, bool]:
  """(python, whether JAX's CUDA 13 plugin is installed) of a Python 3.12 virtualenv that
  holds what the stock JAX GPU image holds of the project's dependencies, at the image's
  versions (launch/images/jax-gpu.txt): installed from PyPI, then everything the image
  lacks removed again (what a bundle carries is in VENV/not_in_image, for tests that
  build none). Kept in ~/.cache/transformer-jax/ under a name made of its list,
  so later runs on this machine reuse it."""
  python = _python_312()
  if python is None:
    pytest.skip("needs Python 3.12 (python3.12 on PATH, or pyenv's 3.12)")
  image, _ = bundle.read_image("jax-gpu")
  pins = {bundle.requirement_name(p): p for p in bundle.image_pins("jax-gpu")}
  wanted = [pins.get(bundle.requirement_name(r), r)  # All, then pruned.
            for r in bundle.requirements([])]
  plugin = [pins["jax-cuda13-plugin"], pins["jax-cuda13-pjrt"]]
  # The project's dependencies the image lacks, which a bundle carries as wheels.
  carried = [name for name in map(bundle.requirement_name, bundle.requirements([]))
             if bundle.normalize(name) not in image]
  key = hashlib.sha256(json.dumps([python, wanted, plugin]).encode()).hexdigest()[:12]
  venv = os.path.expanduser(f"~/.cache/transformer-jax/image-venv-{key}")
  venv_python = os.path.join(venv, "bin", "python")
  if not os.path.exists(os.path.join(venv, "complete")):
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([python, "-m", "venv", venv], check=True)
    pip = [venv_python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, *wanted], check=True, timeout=1200)
    has_plugin = subprocess.run([*pip, *plugin], timeout=1200).returncode == 0
    listed = json.loads(subprocess.run(
        [venv_python, "-m", "pip", "list", "--format=json"], check=True,
        capture_output=True, text=True).stdout)
    extra = [d["name"] for d in listed if bundle.normalize(d["name"]) not in image]
    if extra:  # Not in the image (ml-collections, clu, ...): the bundle brings them.
      subprocess.run([venv_python, "-m", "pip", "uninstall", "--quiet", "-y", *extra],
                     check=True)
    subprocess.run([*pip, "--no-deps", "--target", os.path.join(venv, "not_in_image"),
                    *carried], check=True, timeout=600)
    with open(os.path.join(venv, "complete"), "w") as f:
      json.dump({"plugin": has_plugin}, f)
  with open(os.path.join(venv, "complete")) as f:
    return venv_python, json.load(f)["plugin"]


# The image's jaxlib, which runs the processes started with _offline_env.
IMAGE_JAXLIB = next(pin.split("==")[1] for pin in bundle.image_pins("jax-gpu")
                    if bundle.requirement_name(pin) == "jaxlib")


def _offline_env(**extra) -> dict[str, str]:
  """The image's Python's environment here: every package index unreachable."""
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("PIP_", "PYTHONPATH", "VIRTUAL_ENV", "JAX_COMPILATION"))}
  env.update(PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_FIND_LINKS="",
             https_proxy="http://127.0.0.1:9", http_proxy="http://127.0.0.1:9",
             XLA_FLAGS=xla_flags(1, IMAGE_JAXLIB), **extra)
  return env


@pytest.mark.slow
@pytest.mark.skipif(not all(map(os.path.exists, (SHARED_NEWSTEST, SHARED_MULTI30K))),
                    reason="needs ../shared/data")
def test_bundle_runs_the_quick_suite_offline_on_the_gpu_images_python_and_jax(
    tmp_path, image_python):
  """What a lent GPU machine runs, on its Python (3.12) and JAX (0.11.2): `launch.bundle
  --image=jax-gpu` carries the wheels the image lacks; with the image's packages alone
  and every package index unreachable, `run.sh --quick` finds the Python that imports
  jax (python3 here), installs them and writes results.json: every job's phases
  finished, nothing compiled twice, the figures and where they came from. `run.sh -m`
  runs another command (here the Multi30k sweep's dry run on the carried files), and
  two started at once both install and run."""
  python, has_plugin = image_python
  out = tmp_path / "bundle"
  built = subprocess.run(
      [sys.executable, "-m", "launch.bundle", f"--output={out}", "--image=jax-gpu",
       f"--newstest_dir={SHARED_NEWSTEST}", f"--multi30k_dir={SHARED_MULTI30K}"],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert built.returncode == 0, built.stderr[-3000:]
  wheels = json.loads((out / "bundle.json").read_text())["wheels"]
  assert any(w.startswith("ml_collections-") for w in wheels)
  assert any(w.startswith("sacremoses-") for w in wheels)
  assert any(w.startswith("subword_nmt-") for w in wheels)  # multi30k_wu2021's BPE.
  assert not any(re.match(r"(jax|jaxlib|flax|numpy)-", w) for w in wheels), wheels
  missing = subprocess.run([python, "-c", "import ml_collections"], capture_output=True)
  assert missing.returncode != 0  # The image lacks it; only the bundle brings it.
  multi30k = out / "data" / "multi30k"  # Train, val and test_2016 alone.
  assert sorted(os.listdir(multi30k)) == sorted(bundle.multi30k_files()) and len(
      bundle.multi30k_files()) == 6

  env = _offline_env(PATH=os.path.dirname(python) + os.pathsep + os.environ["PATH"])
  env.pop("PYTHON", None)
  dry_runs = [subprocess.Popen(
      ["bash", str(out / "run.sh"), "-m", "launch",
       "--experiment=experiments/multi30k_wu2021.py", f"--root={out / 'runs'}",
       f"--set=data.manual_dir={multi30k}", "--dry_run"], env=env, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True) for _ in range(2)]
  for dry_run in dry_runs:
    log = dry_run.communicate(timeout=300)[0]
    assert dry_run.returncode == 0, log[-3000:]
    assert f"--workdir={out / 'runs'}/multi30k_wu2021/wu2021" in log, log[-3000:]
  assert (out / "site" / ".installed").exists() and not glob.glob(str(out / ".site.*"))
  # The trials' call in miniature (docs/scaling.md): a smoke trial of the recipe, with
  # its subword-nmt BPE, trained offline on the image's Python, then scored on val.
  runs = out / "runs" / "multi30k_wu2021_smoke" / "wu2021"
  trial = subprocess.run(
      ["bash", str(out / "run.sh"), "-m", "launch", "--experiment=experiments/multi30k_wu2021.py",
       f"--root={out / 'runs'}", "--smoke", "--trials=wu2021",
       f"--set=data.manual_dir={multi30k}"], env=env, capture_output=True, text=True,
      timeout=900)
  assert trial.returncode == 0, (trial.stdout + trial.stderr)[-3000:]
  assert json.loads((runs / "tokenizer.model").read_text())["format"] == "subword-nmt"
  scored = subprocess.run(
      ["bash", str(out / "run.sh"), "-m", "transformer_jax.evaluate", f"--workdir={runs}",
       "--split=eval", "--beam_size=1"], env=env, capture_output=True, text=True,
      timeout=600)
  assert scored.returncode == 0, scored.stderr[-3000:]
  assert "eval_beam1: 1014 sentences" in scored.stdout and "Multi30k-style" in scored.stdout
  run = subprocess.run(["bash", str(out / "run.sh"), "--quick"], env=env,
                       capture_output=True, text=True, timeout=900)
  log = run.stdout + run.stderr
  assert run.returncode == 0, log[-4000:]
  assert "run.sh: python3, Python 3.12" in log and "JAX 0.11.2" in log, log[:2000]
  results = json.loads((out / "out" / "results.json").read_text())
  assert list(results["jobs"]) == ["base", "big", "decode", "profile", "profile_big",
                                   "peers"]
  built_from = json.loads((out / "bundle.json").read_text())
  assert results["code"] == {k: built_from[k] for k in ("fingerprint", "revision")}
  assert results["started"] and results["ended"]
  for name, job in results["jobs"].items():
    assert {p["status"] for p in job["phases"].values()} == {"ok"}, (name, job["phases"])
    assert job["recompiled"] == [], (name, job["recompiled"])
    prov = job["provenance"]
    assert prov["versions"]["jax"] == prov["versions"]["jaxlib"] == "0.11.2", prov
    assert ("jax-cuda13-plugin" in prov["versions"]) == has_plugin, prov
    for key in ("platform", "platform_version", "device_kind", "command", "python"):
      assert prov.get(key), (name, key)
    assert prov["python"].startswith("3.12") and job["started"] and job["ended"]
    assert all(p["seconds"] >= 0 for p in job["phases"].values())
  for name in ("base", "big"):
    for key in ("tokens_per_s", "step_s", "real_token_fraction", "mfu", "mfu_computed",
                "peak_memory_gib"):
      assert results["jobs"][name].get(key) is not None, (name, key)
  assert results["jobs"]["decode"]["decode_sentences"] == 32
  peers = results["jobs"]["peers"]["peers"]  # The same batches, in one process.
  assert peers["this project"]["tokens_per_s"] > 0
  assert built_from["flax_wmt"] == "0.12.12"  # The image's flax, from the package index.
  assert peers["flax_wmt"]["tokens_per_s"] > 0 and peers["flax_wmt"]["ours_over_it"] > 0
  assert peers["pytorch"] == {"skipped": "torch is not installed"}  # Not in this image.
  for name in ("profile", "profile_big"):  # Where a step goes, on the image's JAX.
    job = results["jobs"][name]
    assert job["top_ops"] and (out / "out" / name).is_dir(), name
    assert job["breakdown"]["categories"]["matrix products"]["ms"] > 0, name
  assert (out / "out" / "log.txt").exists() and (out / "jax_cache").is_dir()


def _benchmark_on_the_image(image_python, *flags, code: int = 0):
  """benchmark --json of the numbers smoke config with `flags`, offline, on the image's
  Python and JAX (and what a bundle carries), without a GPU: its figures (with `code`
  other than 0, the finished process)."""
  python, has_plugin = image_python
  if not has_plugin:
    pytest.skip("JAX's CUDA 13 plugin did not install here")
  carried = os.path.join(os.path.dirname(os.path.dirname(python)), "not_in_image")
  env = _offline_env(PYTHONPATH=os.pathsep.join([ROOT, carried]), JAX_PLATFORMS="")
  out = subprocess.run([python, "-m", "transformer_jax.benchmark",
                        "--config=configs/transformer.py:numbers,smoke", *flags, "--json"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert out.returncode == code, out.stderr[-3000:]
  return json.loads(out.stdout) if code == 0 else out


@pytest.mark.slow
def test_the_smoke_config_compiles_for_one_h200_and_the_dot_merger_reaches_its_compiler(
    image_python):
  """benchmark --topology=1xH200 (the lent GPU) on the image's JAX 0.11.2 and its CUDA 13
  plugin, without a GPU: the memory a step needs, and "fits". train.dot_merger=False
  reaches the GPU compiler (the steps' compiler options): the projections that share an
  input (query, key and value) stay separate products, so the step has more product
  kernels for the same FLOPs."""
  figures = {merger: _benchmark_on_the_image(
      image_python, "--config.model.dtype=bfloat16", f"--config.train.dot_merger={merger}",
      "--topology=1xH200") for merger in (True, False)}
  merged = figures[True]
  assert merged["device_kind"] == "NVIDIA H200" and merged["fits"]
  assert merged["jax_version"] == "0.11.2" and 0 < merged["total_gib"] < 0.1
  products = {m: f["roofline"]["categories"]["matrix products"] for m, f in figures.items()}
  assert products[False]["kernels"] > products[True]["kernels"], products
  assert products[False]["flops"] == products[True]["flops"]


def _eight_gpu_overrides() -> list[str]:
  """The --set flags of docs/scaling.md's command for one 8-GPU machine, as config flags."""
  with open(os.path.join(ROOT, "docs", "scaling.md"), encoding="utf-8") as f:
    text = f.read()
  section = text.split("## The paper's results on 8 GPUs")[1].split("```bash")[1]
  command = section.split("```")[0].replace("\\\n", " ")
  return ["--config." + flag.removeprefix("--set=") for flag in command.split()
          if flag.startswith("--set=")]


@pytest.mark.slow
def test_the_documented_8_gpu_recipe_compiles_for_8xh100_and_fits(image_python):
  """docs/scaling.md's GPU overrides for one 8-GPU machine (bfloat16, cuDNN's attention
  where it fits, the hardware dropout generator, the vocabulary padded to 128), on the
  image's JAX and CUDA 13 plugin without a GPU: the train step compiles for 8 H100s,
  its batch split 8 ways, and fits."""
  overrides = _eight_gpu_overrides()
  assert {flag.split("=")[0] for flag in overrides} == {
      "--config.model.dtype", "--config.model.attention_implementation",
      "--config.train.rng_impl", "--config.model.vocab_multiple"}, overrides
  figures = _benchmark_on_the_image(image_python, *overrides, "--topology=8xH100")
  assert figures["devices"] == 8 and figures["device_kind"] == "NVIDIA H100 80GB HBM3"
  assert figures["fits"] and figures["batch"][0] % 8 == 0, figures


@pytest.mark.slow
def test_compiling_cudnns_attention_without_its_library_is_one_line(image_python):
  """The GPU image's packages hold no cuDNN library here (a GPU machine's do): asked to
  compile cuDNN's attention for an H100, the benchmark says what to install, or to let
  cuDNN's be estimated, in one line and exit 2, before compiling anything."""
  out = _benchmark_on_the_image(image_python, "--config.model.dtype=bfloat16",
                                "--config.model.attention_implementation=cudnn",
                                "--topology=1xH100", code=2)
  assert out.stderr.strip().splitlines()[-1] == (
      "error: compiling cuDNN's attention for 1xH100 needs cuDNN's library, which is not "
      "installed here: pip install nvidia-cudnn-cu13 (nvidia-cudnn-cu12 with CUDA 12), or "
      "model.attention_implementation='xla' (cuDNN's then estimated).")


@pytest.mark.slow
@pytest.mark.parametrize("gpu,loss,products,calls", [("1xH100", "pallas", 5, 3),
                                                     ("1xH200", "hybrid", 4, 2)])
def test_the_kernels_compile_into_a_step_for_each_hopper_gpu(image_python, gpu, loss,
                                                             products, calls):
  """train.loss_kernel="pallas" (or "hybrid"), model.norm_kernel="pallas" and
  model.ffn_kernel="pallas" on the image's JAX and CUDA 13 plugin, without a GPU: the
  loss's kernels (forward and both gradients; or forward and the logits' gradient),
  each residual's two (4 + 6 residuals in 2 + 2 layers) and each feed-forward layer's
  one compile into the train step at big's d_model (1024, the widest rows their tiles
  hold: a tile too large for the GPU's shared memory fails here), and the predictor
  counts the loss's products of h by the embedding (100 words, padded to 128): 5, or 4
  with cuBLAS's two, where XLA's loss computes 3."""
  figures = _benchmark_on_the_image(
      image_python, "--config.model.d_model=1024", "--config.model.dtype=bfloat16",
      f"--config.train.loss_kernel={loss}", "--config.model.norm_kernel=pallas",
      "--config.model.ffn_kernel=pallas", *TWO_LAYER_FLAGS, f"--topology={gpu}")
  assert figures["fits"] and figures["roofline"]["pallas_calls"] == calls + 2 * 10 + 4
  rows, length = figures["roofline"]["batch"]
  product = 2.0 * rows * length * 1024  # FLOPs per vocabulary entry of h by the embedding.
  flops = figures["roofline"]["categories"]["vocabulary loss"]["flops"]
  assert products * 100 * product <= flops <= products * 128 * product * 1.1, (
      flops / product)

