"""The code a trial runs: the working tree the launcher starts from, packed to ship.

A pack holds the git clone's tracked files as they are on disk (uncommitted changes
included) and its untracked files that .gitignore does not exclude. It is named by the
code fingerprint (transformer_jax.distributed.code_fingerprint), which every process of
a run computes again at start-up and compares with the others'. trial.json records the
revision, the diff against it and the fingerprint, so a trial's code can be rebuilt.
"""

from __future__ import annotations

import dataclasses
import difflib
import io
import os
import subprocess
import tarfile

from transformer_jax import distributed

MAX_FILE_BYTES = 1 << 20  # An untracked file larger than this is data, not code.
MAX_PACK_BYTES = 16 << 20  # Compressed.


class PackError(ValueError):
  pass


@dataclasses.dataclass(frozen=True)
class Pack:
  data: bytes  # .tar.gz
  fingerprint: str
  revision: str
  diff: str  # `git diff HEAD`, untracked files included.
  files: tuple[str, ...]

  @property
  def name(self) -> str:
    return f"transformer_jax_{self.fingerprint}.tar.gz"

  def record(self) -> dict:
    return {"fingerprint": self.fingerprint, "revision": self.revision, "diff": self.diff}


def _git(repo_dir: str, *args: str) -> str:
  try:
    result = subprocess.run(["git", "-C", repo_dir, *args], capture_output=True, text=True)
  except FileNotFoundError:
    raise PackError("the launcher ships the git clone it runs from, and `git` is not on "
                    "PATH: install git, or pass --noship --repo_dir=PATH.") from None
  if result.returncode:
    raise PackError(f"{repo_dir}: `git {' '.join(args)}` failed: "
                    f"{result.stderr.strip().splitlines()[-1:]}. The launcher ships the "
                    "git clone it runs from; run it from one.")
  return result.stdout


def make(repo_dir: str, max_bytes: int = MAX_PACK_BYTES) -> Pack:
  """Packs `repo_dir`; raises PackError for a large untracked file or a large pack."""
  paths, untracked = _files(repo_dir)
  large = sorted((os.path.getsize(os.path.join(repo_dir, p)), p) for p in untracked
                 if os.path.getsize(os.path.join(repo_dir, p)) > MAX_FILE_BYTES)
  if large:
    size, path = large[-1]
    raise PackError(f"{os.path.join(repo_dir, path)} is {size / 1e6:.1f} MB and not in git: "
                    f"the launcher ships code only (untracked files up to "
                    f"{MAX_FILE_BYTES >> 20} MB). Move it out of the clone or add it to "
                    ".gitignore; put data where the runs read it (data.manual_dir, a bucket).")
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
    for path in paths:
      tar.add(os.path.join(repo_dir, path), arcname=path, recursive=False)
  if buffer.tell() > max_bytes:
    biggest = sorted(paths, key=lambda p: -os.path.getsize(os.path.join(repo_dir, p)))[:3]
    raise PackError(f"the code pack of {repo_dir} is {buffer.tell() / 1e6:.1f} MB, over "
                    f"the {max_bytes / 1e6:.0f} MB limit; its largest files: "
                    f"{', '.join(biggest)}. Ship code only.")
  return Pack(buffer.getvalue(), distributed.code_fingerprint(repo_dir, paths),
              _git(repo_dir, "rev-parse", "HEAD").strip(), _diff(repo_dir, untracked),
              tuple(paths))


def _files(repo_dir: str) -> tuple[list[str], list[str]]:
  """The files a pack holds (tracked, and untracked but not ignored), and the untracked
  ones among them."""
  tracked = _git(repo_dir, "ls-files", "-z", "--cached").split("\0")
  untracked = _git(repo_dir, "ls-files", "-z", "--others", "--exclude-standard").split("\0")
  paths = sorted({p for p in tracked + untracked
                  if p and os.path.isfile(os.path.join(repo_dir, p))})
  return paths, [p for p in paths if p in set(untracked)]


def _diff(repo_dir: str, untracked: list[str]) -> str:
  """`git diff HEAD`, with the untracked files as new files."""
  diff = _git(repo_dir, "diff", "HEAD", "--binary")
  for path in untracked:
    with open(os.path.join(repo_dir, path), errors="replace") as f:
      diff += "".join(difflib.unified_diff([], f.readlines(), "/dev/null", f"b/{path}"))
  return diff


def fingerprint(repo_dir: str) -> str:
  """The fingerprint of the code a launch from `repo_dir` runs, the same for a git clone
  and its pack unpacked elsewhere: the pack's files in a clone, else every file."""
  if os.path.exists(os.path.join(repo_dir, ".git")):
    return distributed.code_fingerprint(repo_dir, _files(repo_dir)[0])
  return distributed.code_fingerprint(repo_dir)


def describe(repo_dir: str) -> dict:
  """What make() records, for code that runs where it is (no size limits; without git,
  the fingerprint alone)."""
  record = {"fingerprint": distributed.code_fingerprint(repo_dir)}
  try:
    record["revision"] = _git(repo_dir, "rev-parse", "HEAD").strip()
    record["diff"] = _diff(repo_dir, _files(repo_dir)[1])
  except PackError:
    pass
  return record


def unpack(pack: Pack, directory: str) -> None:
  """Extracts the pack into `directory` (created), e.g. on a shared filesystem."""
  os.makedirs(directory, exist_ok=True)
  with tarfile.open(fileobj=io.BytesIO(pack.data), mode="r:gz") as tar:
    tar.extractall(directory, filter="data")
