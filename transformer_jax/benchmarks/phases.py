"""A benchmark's figures recorded phase by phase (`Phases`), so that a time limit or a
failing phase loses nothing already measured, and what ran (`provenance`)."""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import json
import re
import subprocess
import sys
import time
import traceback
from typing import Any, Callable, Sequence

import jax
import jax.extend

from transformer_jax import files


class Phases:
  """A benchmark's figures, phase by phase: each phase's seconds and whether it finished,
  failed (with its error) or was skipped, written whole (atomically) to `path` when the
  benchmark starts and after every phase, so that a time limit or a failing phase loses
  nothing already measured."""

  def __init__(self, figures: dict, path: str | None = None,
               budget_s: float | None = None):
    self.figures, self.path, self.budget_s = figures, path, budget_s
    self.start = time.perf_counter()
    figures.setdefault("phases", {})
    self.write()

  def write(self) -> None:
    if self.path:
      files.write_atomic(self.path, json.dumps(self.figures, indent=1))

  def end(self) -> dict:
    """The figures, with the time they ended, written a last time."""
    self.figures["ended"] = now()
    self.write()
    return self.figures

  def ok(self, name: str) -> bool:
    return self.figures["phases"].get(name, {}).get("status") == "ok"

  def run(self, name: str, fn: Callable[[], Any], needs: Sequence[str] = (),
          measures: bool = False) -> Any:
    """fn() as phase `name`: its result, or None if it failed or was skipped (a phase it
    `needs` did not finish, or the time budget is spent). A phase that `measures`
    programs already compiled starts even when the budget is spent: it takes seconds,
    skipping it would waste the compile before it, and the caller's hard stop still
    bounds it."""
    phases = self.figures["phases"]
    elapsed = time.perf_counter() - self.start
    if missing := [n for n in needs if not self.ok(n)]:
      phases[name] = {"status": "skipped", "why": f"needs {', '.join(missing)}"}
    elif (self.budget_s is not None and elapsed > self.budget_s and phases  # Not the first.
          and not measures):
      phases[name] = {"status": "skipped",
                      "why": f"time budget of {self.budget_s:.0f} s spent"}
    if name in phases:
      print(f"phase {name}: skipped ({phases[name]['why']})")
      self.write()
      return None
    print(f"phase {name} ({elapsed:.0f} s in) ...", flush=True)
    start, result = time.perf_counter(), None
    try:
      result = fn()
      phases[name] = {"status": "ok"}
    except Exception as e:  # Recorded; the phases that do not need this one go on.
      traceback.print_exc()
      phases[name] = {"status": "error", "error": f"{type(e).__name__}: {e}"[-3000:]}
      print(f"phase {name}: failed: {phases[name]['error'].splitlines()[0][:300]}")
    phases[name]["seconds"] = time.perf_counter() - start
    self.write()
    return result


def now() -> str:
  """The local time, to the second, as the figures record when they start and end."""
  return datetime.datetime.now().isoformat(timespec="seconds")


def failed(figures: dict) -> list[str]:
  """The phases that failed."""
  return [n for n, p in figures.get("phases", {}).items() if p["status"] == "error"]


def report(measure: Callable[[], dict], as_json: bool) -> None:
  """measure()'s readable lines on stdout, or with `as_json` on stderr and its figures
  as one JSON object on stdout; exit 1 if a phase failed."""
  with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():
    figures = measure()
  if as_json:
    print(json.dumps(figures, indent=1))
  if failed(figures):
    sys.exit(1)


def provenance() -> dict:
  """What ran: package versions, the backend and its platform version, cuDNN's version
  where it can be read, the devices (kind, memory), the GPU driver (nvidia-smi), the
  command line."""
  versions = {}
  for dist in importlib.metadata.distributions():
    name = dist.metadata["Name"] or ""
    if re.fullmatch(r"(jax|jaxlib|libtpu|jax[-_]cuda\d+[-_](plugin|pjrt)|flax|optax|"
                    r"orbax[-_]checkpoint|numpy)", name, re.IGNORECASE):
      versions[name.lower().replace("_", "-")] = dist.version
  backend = jax.extend.backend.get_backend()
  device = jax.devices()[0]
  stats = device.memory_stats() or {}
  out = {"versions": dict(sorted(versions.items())), "jax_version": jax.__version__,
         "platform": backend.platform, "platform_version": backend.platform_version,
         "device_kind": device.device_kind, "device_count": jax.device_count(),
         "process_count": jax.process_count(),
         "device_memory_gib": stats["bytes_limit"] / 2**30 if "bytes_limit" in stats
                              else None,
         "command": " ".join(sys.argv), "python": sys.version.split()[0]}
  if backend.platform == "gpu":
    try:
      from jax._src.lib import cuda_versions  # The CUDA plugin's; None without one.
      out["cudnn_version"] = cuda_versions.cudnn_get_version() if cuda_versions else None
    except Exception as e:  # Not loadable here: say why rather than guess.
      out["cudnn_version"] = f"unknown ({e})"
    try:
      smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                            "--format=csv,noheader"], capture_output=True, text=True,
                           timeout=30)
      out["nvidia_smi"] = smi.stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError) as e:
      out["nvidia_smi"] = f"unavailable ({e})"
  return out
