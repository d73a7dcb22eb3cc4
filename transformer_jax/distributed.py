"""Starting JAX's multi-process runtime (one process per host, or per GPU).

Explicit: --coordinator_address=host:port --num_processes=N --process_id=I on every
process. Detected: SLURM with more than one task, multi-host TPU VMs and Open MPI,
where `jax.distributed.initialize()` reads everything from the environment.
"""

from __future__ import annotations

import logging
import os

import jax


def _cluster_detected() -> str | None:
  if int(os.environ.get("SLURM_NTASKS", "1")) > 1 and "SLURM_JOB_ID" in os.environ:
    return "SLURM"
  if "," in os.environ.get("TPU_WORKER_HOSTNAMES", ""):
    return "TPU pod"
  if int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")) > 1:
    return "Open MPI"
  return None


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
