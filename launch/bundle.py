r"""An offline bundle: one folder to carry to a machine that reaches no package index (a
lent GPU machine, a cluster node without internet) and run there with one command.

  python -m launch.bundle --output=DIR [--image=jax-gpu] [--newstest_dir=DIR]
  # ... carry DIR to the machine, then, there:
  bash DIR/run.sh [--quick] [--out=DIR/out] [--workdir=TRAINED_RUN]

DIR holds:
  code/      this working tree, as the launcher ships it (launch/pack.py)
  wheels/    wheels of every dependency the target image lacks, resolved here for the
             image's Python (--image=jax-gpu: the stock JAX GPU image, whose packages
             launch/images/jax-gpu.txt lists; --image=none: all of them)
  data/      newstest2014.en and .de (--newstest_dir), for the benchmark's lengths;
             data/multi30k/ (--multi30k_dir): Multi30k's train, val and test_2016_flickr,
             checked against the release's checksums, for training there
             (`run.sh -m launch ...`; docs/scaling.md, "Training on the GPU")
  run.sh     installs the wheels into DIR/site with `pip --no-index --no-deps --target`
             (nothing from the network), then runs `python -m
             transformer_jax.benchmarks.suite` from code/, which writes results.json,
             log.txt and a profiler trace under --out (default DIR/out); its Python:
             --python, $PYTHON, or the first of the GPU image's
             /opt/torch/.venv/bin/python3 and python3 that imports jax (logged);
             compiled programs are cached in DIR/jax_cache; `run.sh -m MODULE ...`
             runs any of the code's commands instead, with the same Python and wheels
  bundle.json  what the bundle holds: code fingerprint and revision, image, wheels
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib

from absl import flags

from launch import pack
from transformer_jax import cli
from transformer_jax.config import InputError
from transformer_jax.data.datasets.multi30k import release as multi30k

FLAGS = flags.FLAGS
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGES = os.path.join(ROOT, "launch", "images")
# Wheel platforms a current x86-64 Linux (glibc 2.35 or newer) installs.
PLATFORMS = ("linux_x86_64", "manylinux2014_x86_64",
             *(f"manylinux_2_{minor}_x86_64" for minor in range(17, 36)))

RUN_SH = r"""#!/usr/bin/env bash
# Runs the measurement suite from this bundle, installing nothing from the network:
#   bash run.sh [--quick] [--jobs=base,big,decode,profile] [--kernels=loss,norm] [--out=DIR]
#               [--workdir=TRAINED_RUN] [--python=PYTHON]
#   bash run.sh [--python=PYTHON] -m MODULE [ARGS]   # any command of the code instead
# Python: --python, else $PYTHON, else the first of /opt/torch/.venv/bin/python3 (the
# stock GPU image's) and python3 that imports jax. Compiled programs are cached in
# jax_cache/ beside this script ($JAX_COMPILATION_CACHE_DIR wins), so a later call on
# the same machine loads what an earlier one compiled.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-}"
args=()
for arg in "$@"; do
  case "$arg" in
    --python=*) python="${arg#--python=}" ;;
    *) args+=("$arg") ;;
  esac
done
if [ -z "$python" ]; then
  for candidate in /opt/torch/.venv/bin/python3 python3; do
    if command -v "$candidate" > /dev/null && "$candidate" -c "import jax" 2> /dev/null; then
      python="$candidate"
      break
    fi
  done
fi
if [ -z "$python" ]; then
  echo "run.sh: no Python here imports jax (tried /opt/torch/.venv/bin/python3, python3);" \
       "name one with --python=PATH or PYTHON=PATH" >&2
  exit 2
fi
echo "run.sh: $python, $("$python" -c 'import sys, jax; print("Python", sys.version.split()[0], "JAX", jax.__version__)')" >&2
site="$here/site"
if compgen -G "$here/wheels/*.whl" > /dev/null && [ ! -f "$site/.installed" ]; then
  # Installed aside, then renamed into place: several run.sh started at once (trials
  # side by side) each install, and the first rename wins. A complete site/ is never
  # removed (another run.sh may be running from it), so an install cut short leaves only
  # a .site.* folder behind.
  fresh="$(mktemp -d "$here/.site.XXXXXX")"
  "$python" -m pip install --quiet --no-index --no-deps --no-compile --target "$fresh" \
      "$here"/wheels/*.whl
  touch "$fresh/.installed"
  mv -T "$fresh" "$site" 2> /dev/null || rm -rf "$fresh"
  if [ -e "$site" ] && [ ! -f "$site/.installed" ]; then
    echo "run.sh: $site was not made by run.sh (no .installed in it); remove it and run" \
         "again" >&2
    exit 2
  elif [ ! -e "$site" ]; then
    echo "run.sh: the wheels installed, but could not be moved to $site" >&2
    exit 1
  fi
fi
export PYTHONPATH="$here/code:$site${PYTHONPATH:+:$PYTHONPATH}"
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$here/jax_cache}"
cd "$here/code"
if [ "${args[0]:-}" = "-m" ]; then
  exec "$python" "${args[@]}"
fi
peers=()
[ -d "$here/peers/flax_wmt" ] && peers+=(--flax_wmt_dir="$here/peers/flax_wmt")
exec "$python" -m transformer_jax.benchmarks.suite --newstest_dir="$here/data" \
    --out="$here/out" "${peers[@]}" "${args[@]}"
"""


def normalize(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(spec: str) -> str:
  """The normalized distribution name of a requirement: "etils[epath]" -> "etils",
  "jax==0.11.2" -> "jax"."""
  return normalize(re.split(r"[=<>!~ \[;]", spec.strip())[0])


def read_image(image: str) -> tuple[set[str], str | None]:
  """(normalized distribution names, Python version) of an image list; 'none': empty."""
  if image == "none":
    return set(), None
  path = os.path.join(IMAGES, f"{image}.txt")
  if not os.path.exists(path):
    known = sorted(f[:-4] for f in os.listdir(IMAGES) if f.endswith(".txt"))
    cli.fail(f"--image={image!r}: no list {path}; valid: {known + ['none']}")
  names, python = set(), None
  for line in image_lines(path):
    if line.startswith("python "):
      python = line.split()[1]
    else:
      names.add(requirement_name(line))
  return names, python


def image_lines(path: str) -> list[str]:
  """An image list's lines without comments: `python X.Y`, then NAME or NAME==VERSION."""
  with open(path) as f:
    return [line.split("#")[0].strip() for line in f if line.split("#")[0].strip()]


def image_pins(image: str) -> list[str]:
  """The NAME==VERSION lines of an image list: the versions it is known to hold."""
  return [line for line in image_lines(os.path.join(IMAGES, f"{image}.txt"))
          if "==" in line]


def requirements(extras: list[str]) -> list[str]:
  """The project's dependencies (pyproject.toml), with the named extras."""
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    project = tomllib.load(f)["project"]
  reqs = list(project["dependencies"])
  for extra in extras:
    if extra not in project["optional-dependencies"]:
      cli.fail(f"--extras={extra!r}: not in pyproject.toml; valid: "
               f"{sorted(project['optional-dependencies'])}")
    reqs += project["optional-dependencies"][extra]
  return reqs


def _pip(*args: str) -> None:
  subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def resolve(reqs: list[str], python: str) -> list[tuple[str, str]]:
  """(name, version) of every distribution the requirements need on `python` (pip's
  resolver, reading metadata only: nothing is installed or fully downloaded)."""
  with tempfile.TemporaryDirectory() as tmp:
    report = os.path.join(tmp, "report.json")
    _pip("install", "--quiet", "--dry-run", "--ignore-installed", "--report", report,
         "--target", os.path.join(tmp, "target"), "--only-binary=:all:",
         "--python-version", python, *(f"--platform={p}" for p in PLATFORMS), *reqs)
    with open(report) as f:
      return [(item["metadata"]["name"], item["metadata"]["version"])
              for item in json.load(f)["install"]]


def multi30k_files() -> list[str]:
  """The Multi30k files a bundle carries: the splits training reads (train, val,
  test_2016_flickr); the other test sets stay the project's untouched check."""
  return multi30k.file_names()


def data_files(flag: str, names: list[str]) -> list[str]:
  """The paths of `names` in the folder --`flag` names (none without the flag); a
  missing one is a usage error."""
  if not getattr(FLAGS, flag):
    return []
  paths = [os.path.join(getattr(FLAGS, flag), name) for name in names]
  if missing := [p for p in paths if not os.path.exists(p)]:
    cli.fail(f"--{flag}: {missing[0]} does not exist.")
  return paths


def flax_wmt_example(version: str, dest: str) -> bool:
  """The Flax WMT example's train.py, models.py and decode.py into `dest`, from flax
  `version`'s source distribution (the package index has it; its wheels lack the
  examples), for the suite's peers job. False, with a line, if it cannot be had."""
  with tempfile.TemporaryDirectory() as tmp:
    try:
      _pip("download", "--quiet", "--no-deps", "--no-binary=:all:",
           "--ignore-requires-python", "--dest", tmp, f"flax=={version}")  # Files only.
      archive, = (os.path.join(tmp, f) for f in os.listdir(tmp))
      with tarfile.open(archive) as tar:
        members = {os.path.basename(m.name): m for m in tar.getmembers()
                   if "/examples/wmt/" in m.name and m.name.count("/") == 3}
        os.makedirs(dest)
        for name in ("train.py", "models.py", "decode.py"):
          with tar.extractfile(members[name]) as src, open(os.path.join(dest, name),
                                                           "wb") as out:
            shutil.copyfileobj(src, out)
      return True
    except (subprocess.CalledProcessError, KeyError, ValueError, OSError) as e:
      print(f"the Flax WMT example (flax {version}'s sdist) is not carried ({e}); the "
            "peers job will skip it", flush=True)
      shutil.rmtree(dest, ignore_errors=True)
      return False


def main():
  if not FLAGS.output:
    cli.fail("--output=DIR is required.")
  if os.path.exists(FLAGS.output):
    cli.fail(f"--output={FLAGS.output} exists; name a new folder.")
  image, image_python = read_image(FLAGS.image)
  python = FLAGS.python_version or image_python or "%d.%d" % sys.version_info[:2]
  news = data_files("newstest_dir", [f"newstest2014.{lang}" for lang in ("en", "de")])
  m30k = data_files("multi30k_dir", multi30k_files())
  try:  # The release's files, as training reads them: nothing else is carried.
    m30k = [multi30k.verified(p) for p in m30k]
  except InputError as e:
    cli.fail(f"--multi30k_dir: {e}")
  repo = FLAGS.repo_dir or ROOT
  try:
    code = pack.make(repo)
  except pack.PackError as e:
    cli.fail(str(e))

  print(f"resolving the dependencies for Python {python} ...", flush=True)
  needed = resolve(requirements(FLAGS.extras), python)
  carried = sorted((n, v) for n, v in needed if normalize(n) not in image)
  os.makedirs(FLAGS.output)
  wheels = os.path.join(FLAGS.output, "wheels")
  os.makedirs(wheels)
  if carried:
    print(f"downloading {len(carried)} wheels the image lacks: "
          f"{', '.join(f'{n}=={v}' for n, v in carried)}", flush=True)
    _pip("download", "--quiet", "--no-deps", "--only-binary=:all:", "--dest", wheels,
         "--python-version", python, *(f"--platform={p}" for p in PLATFORMS),
         *(f"{n}=={v}" for n, v in carried))
  pack.unpack(code, os.path.join(FLAGS.output, "code"))
  data = os.path.join(FLAGS.output, "data")
  os.makedirs(data)
  for path in news:
    shutil.copy(path, data)
  if m30k:
    os.makedirs(os.path.join(data, "multi30k"))
  for path in m30k:
    shutil.copy(path, os.path.join(data, "multi30k"))
  flax = next((p.split("==")[1] for p in (image_pins(FLAGS.image) if FLAGS.image != "none"
                                          else []) if requirement_name(p) == "flax"),
              importlib.metadata.version("flax"))
  carried_flax = FLAGS.flax_wmt and flax_wmt_example(
      flax, os.path.join(FLAGS.output, "peers", "flax_wmt"))
  run_sh = os.path.join(FLAGS.output, "run.sh")
  with open(run_sh, "w") as f:
    f.write(RUN_SH)
  os.chmod(run_sh, 0o755)
  with open(os.path.join(FLAGS.output, "bundle.json"), "w") as f:
    json.dump({"fingerprint": code.fingerprint, "revision": code.revision,
               "image": FLAGS.image, "python": python,
               "wheels": sorted(os.listdir(wheels)),
               "from_image": sorted(n for n, _ in needed if normalize(n) in image),
               "newstest": bool(FLAGS.newstest_dir),
               "flax_wmt": flax if carried_flax else None,
               "multi30k": bool(FLAGS.multi30k_dir)}, f, indent=1)
  size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(FLAGS.output)
             for f in fs)
  print(f"bundle {FLAGS.output}: {size / 2**20:.1f} MiB, code {code.fingerprint[:12]}, "
        f"{len(carried)} wheels; on the target: bash {FLAGS.output}/run.sh [--quick]")


def define_flags() -> None:
  """The command's flags (defined when run as a command, not on import)."""
  flags.DEFINE_string("output", None, "The bundle's folder (created; must not exist).")
  flags.DEFINE_string("image", "jax-gpu", "The target machine's image: a list in "
                      "launch/images/ (jax-gpu), or 'none' to carry every dependency.")
  flags.DEFINE_string("newstest_dir", None, "Folder with newstest2014.en and .de to carry.")
  flags.DEFINE_string("multi30k_dir", None, "Folder of Multi30k's plain files to carry: "
                      "train, val and test_2016_flickr, each .en.gz and .de.gz (its other "
                      "test sets are never carried).")
  flags.DEFINE_string("python_version", None, "The target's Python (default: the image's; "
                      "with --image=none, this interpreter's).")
  flags.DEFINE_list("extras", [], "Optional dependency groups of pyproject.toml to carry "
                    "too, e.g. cuda13 with --image=none.")
  flags.DEFINE_string("repo_dir", None, "The working tree to carry (default: this one).")
  flags.DEFINE_bool("flax_wmt", True, "Carry the Flax WMT example (from the image's flax "
                    "version's source distribution) for the suite's peers job.")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
