"""Starting JAX's multi-process runtime (one process per host, or per GPU).

Explicit: --coordinator_address=host:port --num_processes=N --process_id=I on every
process. Detected: any cluster that `jax.distributed.initialize()` recognises by itself
(SLURM's tasks, a TPU slice's hosts, Open MPI's ranks...: jax/_src/clusters/) and that
says the run has more than one process; jax then reads everything from the environment.
"""

from __future__ import annotations

import hashlib
import logging
import os
import warnings

import jax
import numpy as np
from jax.experimental import multihost_utils


def _cluster_detected() -> str | None:
  """The cluster jax.distributed.initialize() would take its settings from (the first
  it detects, as it chooses), if that cluster's run has several processes; else None:
  a lone process (one SLURM task, a single-host TPU) starts no distributed runtime."""
  from jax._src import clusters  # jax.distributed's own detection; no public name.
  with warnings.catch_warnings():  # Kubernetes seen without its package: not ours.
    warnings.simplefilter("ignore")
    cluster = next((c for c in clusters.ClusterEnv._cluster_types
                    if not c.opt_in_only_method and c.is_env_present()), None)
  if cluster is None or cluster.get_process_count() <= 1:
    return None
  return (cluster.name or cluster.__name__).upper()  # For the log: SLURM, OMPI, ...


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> None:
  """Initialises jax.distributed if this run spans several processes; else nothing."""
  cluster = _cluster_detected()
  if not coordinator_address and not cluster:
    return
  if coordinator_address and (num_processes is None or process_id is None):
    raise ValueError("--coordinator_address needs --num_processes and --process_id too.")
  # CPU-only runs (and tests) need a collectives backend across processes.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if coordinator_address:
    jax.distributed.initialize(coordinator_address, num_processes, process_id)
  else:
    jax.distributed.initialize()
  logging.info("process %d of %d (%s), %d local / %d global devices", jax.process_index(),
               jax.process_count(), cluster or coordinator_address,
               jax.local_device_count(), jax.device_count())


CODE = ("pyproject.toml", "transformer_jax", "configs", "launch", "experiments")


def code_fingerprint(root: str | None = None, paths: list[str] | None = None) -> str:
  """12 hex digits of SHA-256 over the code a run executes: `paths` (relative to
  `root`), or every file of CODE under `root` (default: where this package was
  imported from). The launcher names a shipped pack by the same fingerprint."""
  root = root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  if paths is None:
    paths = [os.path.relpath(os.path.join(d, f), root) for top in CODE
             for d, _, names in os.walk(os.path.join(root, top))
             for f in names if "__pycache__" not in d]
    paths += [p for p in CODE if os.path.isfile(os.path.join(root, p))]
  digest = hashlib.sha256()
  for path in sorted(p for p in paths if p.split(os.sep)[0] in CODE):
    with open(os.path.join(root, path), "rb") as f:
      digest.update(path.encode() + b"\0" + hashlib.sha256(f.read()).digest())
  return digest.hexdigest()[:12]


def check_same_code() -> str:
  """Returns this process's code fingerprint; raises ValueError, naming each process's,
  when the processes of a run import different code."""
  fingerprint = code_fingerprint()
  if jax.process_count() > 1:
    mine = np.frombuffer(bytes.fromhex(fingerprint), np.uint8).astype(np.int32)
    every = np.asarray(multihost_utils.process_allgather(mine))
    if (every != every[0]).any():
      names = ", ".join(f"process {i}: {bytes(row.astype(np.uint8)).hex()}"
                        for i, row in enumerate(every))
      raise ValueError(f"the processes of this run import different code ({names}; "
                       f"process {jax.process_index()} from {os.path.dirname(__file__)}). "
                       "Run one tree everywhere: `python -m launch` ships it.")
  return fingerprint
