"""Accelerators' datasheet peaks, and TPU slices as gcloud names them (v4-8,
v5litepod-16, v5p-64, v6e-8) as compile-only devices: libtpu, the TPU compiler, compiles
for a slice on any x86-64 or arm64 Linux machine without TPUs (as MaxText's
train_compile.py does), and reports the memory each chip needs and its own estimate of a
step's time.

    pip install 'jax[tpu]'   # libtpu; the same JAX version as installed
"""

from __future__ import annotations

import dataclasses
import math
import os

import jax

from transformer_jax.config import InputError

# Dense bfloat16 peaks per device, TFLOP/s, from the vendors' datasheets, matched
# against jax.Device.device_kind in this order (GPUs by substring, TPUs exactly).
PEAK_TFLOPS = (
    ("H100 PCIe", 756.0, "NVIDIA H100 PCIe datasheet"),
    ("H100 NVL", 835.0, "NVIDIA H100 NVL datasheet"),
    ("H100 80GB HBM3", 989.0, "NVIDIA H100 SXM datasheet"),
    ("H100 SXM", 989.0, "NVIDIA H100 SXM datasheet"),
    ("H200 NVL", 835.0, "NVIDIA H200 NVL datasheet"),
    ("H200", 989.0, "NVIDIA H200 SXM datasheet"),
    ("A100", 312.0, "NVIDIA A100 datasheet (SXM and PCIe)"),
    ("=TPU v4", 275.0, "Google Cloud TPU v4"),
    ("=TPU v5 lite", 197.0, "Google Cloud TPU v5e"),
    ("=TPU v5", 459.0, "Google Cloud TPU v5p"),
    ("=TPU v5p", 459.0, "Google Cloud TPU v5p"),
    ("=TPU v6 lite", 918.0, "Google Cloud TPU v6e"),
    ("=TPU v6e", 918.0, "Google Cloud TPU v6e"),
)


def datasheet_peak(device_kind: str) -> tuple[float, str] | None:
  """(dense bf16 TFLOP/s, datasheet) of a device kind in PEAK_TFLOPS, or None."""
  for name, tflops, source in PEAK_TFLOPS:
    exact = name.startswith("=")
    if (device_kind == name[1:]) if exact else (name in device_kind):
      return tflops, source
  return None


# gcloud's prefix -> libtpu's name, chip config, gcloud's count per chip (TensorCores for
# v4 and v5p, chips for v5e and v6e), device kind; per chip, from Google Cloud's
# datasheets: HBM GiB and GB/s (the peak is PEAK_TFLOPS's).
GENERATIONS = {
    "v4": ("v4", "megacore", 2, "TPU v4", 32.0, 1228.0),
    "v5p": ("v5", "megacore", 2, "TPU v5", 95.0, 2765.0),
    "v5litepod": ("v5e", "default", 1, "TPU v5 lite", 16.0, 819.0),
    "v6e": ("v6e", "default", 1, "TPU v6 lite", 32.0, 1640.0),
}
SHAPES_3D = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4),
             128: (4, 4, 8), 256: (4, 8, 8), 512: (8, 8, 8)}  # v4, v5p: 3-D tori.
SHAPES_2D = {1: (1, 1, 1), 4: (2, 2, 1), 8: (2, 4, 1), 16: (4, 4, 1), 32: (4, 8, 1),
             64: (8, 8, 1), 128: (8, 16, 1), 256: (16, 16, 1)}  # v5e, v6e.


@dataclasses.dataclass(frozen=True)
class Tpu:
  accelerator_type: str  # gcloud's, e.g. v5p-64.
  generation: str  # libtpu's, e.g. v5.
  chip_config: str
  shape: tuple[int, int, int]  # Chips along each axis.
  device_kind: str  # As jax.Device.device_kind names the chip.
  hbm_gib: float  # Per chip.
  hbm_gbps: float  # Per chip.

  @property
  def peak_tflops(self) -> float:
    """Per chip, dense bfloat16, from its datasheet."""
    return datasheet_peak(self.device_kind)[0]

  @property
  def chips(self) -> int:
    return math.prod(self.shape)

  @property
  def chips_per_host(self) -> tuple[int, int, int]:
    """4 chips a host (2x2), except single-host v5e and v6e slices of up to 8."""
    return self.shape if self.generation in ("v5e", "v6e") and self.chips <= 8 else (2, 2, 1)

  @property
  def hosts(self) -> int:
    return self.chips // math.prod(self.chips_per_host)

  @property
  def topology_name(self) -> str:
    dims = self.shape if self.generation in ("v4", "v5") else self.shape[:2]
    return f"{self.generation}:{'x'.join(map(str, dims))}"


def parse(accelerator_type: str) -> Tpu:
  """The slice that gcloud's `accelerator_type` names; InputError names valid ones."""
  prefix, _, count = accelerator_type.rpartition("-")
  if prefix not in GENERATIONS or not count.isdigit():
    raise InputError(f"TPU type {accelerator_type!r}: expected GENERATION-COUNT as gcloud "
                     f"names it, GENERATION one of {', '.join(GENERATIONS)} (v4-8, "
                     "v5litepod-16, v5p-64, v6e-8).")
  generation, chip_config, per_chip, kind, hbm, bandwidth = GENERATIONS[prefix]
  shapes = SHAPES_3D if per_chip == 2 else SHAPES_2D
  chips = int(count) // per_chip
  if int(count) % per_chip or chips not in shapes:
    valid = ", ".join(f"{prefix}-{n * per_chip}" for n in shapes)
    raise InputError(f"TPU type {accelerator_type!r}: no such slice here; valid: {valid}.")
  return Tpu(accelerator_type, generation, chip_config, shapes[chips], kind, hbm, bandwidth)


def devices(tpu: Tpu, num_slices: int = 1) -> list[jax.Device]:
  """Compile-only devices of `num_slices` such slices (libtpu), in mesh order."""
  # libtpu reads these once; on a machine that is not a TPU VM they only quiet warnings,
  # and let several processes compile at once (none of them opens a chip).
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", tpu.accelerator_type)
  from jax.experimental import topologies
  try:
    desc = topologies.get_topology_desc(
        platform="tpu", topology_name=tpu.topology_name, chip_config_name=tpu.chip_config,
        chips_per_host_bounds=tpu.chips_per_host, num_slices=num_slices)
  except RuntimeError as e:
    if "not installed" in str(e):
      raise InputError(f"compiling for {tpu.accelerator_type} needs libtpu, the TPU "
                       f"compiler: pip install 'jax[tpu]=={jax.__version__}' (x86-64 or "
                       "arm64 Linux).") from e
    raise
  return list(desc.devices)
