"""Accelerators' datasheet peaks, and accelerators that are not here as compile-only
devices:

- TPU slices as gcloud names them (v4-8, v5litepod-16, v5p-64, v6e-8): libtpu, the TPU
  compiler, compiles for a slice on any x86-64 or arm64 Linux machine without TPUs (as
  MaxText's train_compile.py does), and reports the memory each chip needs and its own
  estimate of a step's time. Install: pip install 'jax[tpu]' (the installed JAX's version).
- NVIDIA GPU systems as NxMODEL (8xH100, 16xH200: 8 GPUs a host): JAX's CUDA plugin
  compiles for a GPU described by a target config (XLA's GpuTargetConfigProto, written
  here from the datasheet) without a GPU or a CUDA driver. It reports memory per GPU, not
  a step time. Install: pip install -e '.[gpu-aot]' on a machine without a GPU (its CUDA
  12 plugin prints "Could not find cuda drivers" at every JAX start).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

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

  def devices(self, num_slices: int = 1) -> list[jax.Device]:
    """Compile-only devices of `num_slices` such slices (libtpu), in mesh order."""
    # libtpu reads these once; on a machine that is not a TPU VM they only quiet warnings,
    # and let several processes compile at once (none of them opens a chip).
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", self.accelerator_type)
    _without_persistent_cache()
    from jax.experimental import topologies
    try:
      desc = topologies.get_topology_desc(
          platform="tpu", topology_name=self.topology_name,
          chip_config_name=self.chip_config, chips_per_host_bounds=self.chips_per_host,
          num_slices=num_slices)
    except RuntimeError as e:
      if "not installed" in str(e):
        raise InputError(f"compiling for {self.accelerator_type} needs libtpu, the TPU "
                         f"compiler: pip install 'jax[tpu]=={jax.__version__}' (x86-64 or "
                         "arm64 Linux).") from e
      raise
    return list(desc.devices)


def _without_persistent_cache() -> None:
  """Compile-only devices cannot load programs from JAX's persistent compilation cache
  (no client to load them into: each read warns, then compiles again), so programs
  compiled for them are neither written nor read."""
  jax.config.update("jax_enable_compilation_cache", False)


def parse_tpu(accelerator_type: str) -> Tpu:
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


# Per GPU, from NVIDIA's datasheets (SXM parts): device kind, streaming multiprocessors,
# memory bytes (as the driver reports them), HBM GB/s, L2 MiB, boost clock GHz, compute
# capability (major).
GPUS = {
    "H100": ("NVIDIA H100 80GB HBM3", 132, 84_942_979_072, 3350.0, 50, 1.98, 9),
    "H200": ("NVIDIA H200", 132, 150_754_820_096, 4800.0, 50, 1.98, 9),
}
GPUS_PER_HOST = 8


def jax_memory_fraction() -> float:
  """The share of a GPU's memory JAX takes: XLA_PYTHON_CLIENT_MEM_FRACTION, default 0.75."""
  return float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", 0.75))


@dataclasses.dataclass(frozen=True)
class Gpus:
  """NVIDIA GPUs, 8 a host, with the attributes of a Tpu that the fit check reads."""

  accelerator_type: str  # e.g. 8xH100.
  model: str  # A key of GPUS.
  chips: int  # GPUs.

  @property
  def device_kind(self) -> str:
    return GPUS[self.model][0]

  @property
  def hosts(self) -> int:
    return -(-self.chips // GPUS_PER_HOST)

  @property
  def hbm_gib(self) -> float:
    """What a JAX process may use of one GPU's memory by default."""
    return GPUS[self.model][2] * jax_memory_fraction() / 2**30

  @property
  def hbm_gbps(self) -> float:
    return GPUS[self.model][3]

  @property
  def peak_tflops(self) -> float:
    return datasheet_peak(self.device_kind)[0]

  def target_config(self) -> str:
    """The GPU as XLA's GpuTargetConfigProto (text format) describes it."""
    kind, sms, memory, bandwidth, l2_mib, clock, major = GPUS[self.model]
    shared = 233_472  # Hopper's shared memory per SM.
    return f"""gpu_device_info {{
  threads_per_block_limit: 1024 threads_per_warp: 32 threads_per_core_limit: 2048
  shared_memory_per_block: 49152 shared_memory_per_core: {shared}
  shared_memory_per_block_optin: {shared - 1024}
  core_count: {sms} fpus_per_core: 128
  block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535
  memory_bandwidth: {int(bandwidth * 1e9)} l2_cache_size: {l2_mib * 2**20}
  clock_rate_ghz: {clock} device_memory_size: {memory}
  cuda_compute_capability {{ major: {major} }}
  registers_per_core_limit: 65536 registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 10 }}
device_description_str: "{kind}"
"""

  def devices(self, num_slices: int = 1) -> list[jax.Device]:
    """Compile-only devices of `num_slices` such systems (JAX's CUDA plugin)."""
    # The plugin checks the CUDA libraries' versions at start-up; compiling needs none.
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    # Without a GPU to autotune on, XLA's untuned Triton tiling fails on some small float32
    # matrix products ("Couldn't find output tile sizes"); cuBLAS's need no tuning.
    if "xla_gpu_enable_triton_gemm" not in os.environ.get("XLA_FLAGS", ""):
      os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                 " --xla_gpu_enable_triton_gemm=false").strip()
    _without_persistent_cache()
    from jax.experimental import topologies
    per_host = min(self.chips, GPUS_PER_HOST)
    try:
      desc = topologies.get_topology_desc(
          "gpus", "cuda", topology=f"{num_slices}x{self.hosts}x{per_host}",
          target_config=self.target_config())
    except NotImplementedError as e:
      raise InputError(f"compiling for {self.accelerator_type} needs JAX's CUDA plugin: pip "
                       f"install 'jax[cuda12-local]=={jax.__version__}' (or -e '.[gpu-aot]'; "
                       "x86-64 Linux).") from e
    return list(desc.devices)


def parse(name: str) -> Tpu | Gpus:
  """The TPU slice that gcloud's accelerator type names, or NxMODEL GPUs (8xH100);
  InputError names valid ones."""
  if match := re.fullmatch(r"(\d+)x([A-Za-z0-9]+)", name):
    count, model = int(match[1]), match[2].upper()
    if model not in GPUS or not count or (count > GPUS_PER_HOST and count % GPUS_PER_HOST):
      raise InputError(f"GPUs {name!r}: expected NxMODEL, MODEL one of {', '.join(GPUS)}, "
                       f"N up to {GPUS_PER_HOST} or a multiple of it (8xH100, 16xH200).")
    return Gpus(name, model, count)
  return parse_tpu(name)
