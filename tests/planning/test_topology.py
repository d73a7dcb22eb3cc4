"""Compiling for TPU slices and GPUs that are not here, on this CPU (libtpu's and JAX's
CUDA plugin's compile-only devices): the memory a chip needs, whether it fits, and the
refusal, in one line, of a config that does not, by the benchmark and by the TPU launcher
before it creates a TPU."""

import glob
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from transformer_jax.config import InputError
from transformer_jax.planning import topology

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason="libtpu is not installed (pip install 'jax[tpu]'; x86-64 Linux)")
needs_cuda_plugin = pytest.mark.skipif(
    importlib.util.find_spec("jax_cuda12_plugin") is None,
    reason="JAX's CUDA plugin is not installed (pip install -e '.[gpu-aot]'; x86-64 Linux)")
SMOKE = "--config=configs/transformer.py:numbers,smoke"
# Parameters, gradients and Adam state of 32 layers of d_ff 131072 (2.2 billion
# parameters): too large for a v5litepod-4 chip's 16 GiB unless sharded over the chips
# (FSDP). Layers scanned and d_model 256: each compile takes seconds, not minutes.
HUGE_FIELDS = {"model.d_model": 256, "model.d_ff": 131072, "model.num_encoder_layers": 16,
               "model.num_decoder_layers": 16, "model.scan_layers": True}
HUGE = [f"--config.{k}={v}" for k, v in HUGE_FIELDS.items()]


@pytest.mark.parametrize("name,topology_name,chips,hosts", [
    ("v4-8", "v4:2x2x1", 4, 1), ("v4-32", "v4:2x2x4", 16, 4),
    ("v5litepod-4", "v5e:2x2", 4, 1), ("v5litepod-8", "v5e:2x4", 8, 1),
    ("v5litepod-16", "v5e:4x4", 16, 4), ("v5p-8", "v5:2x2x1", 4, 1),
    ("v5p-64", "v5:2x4x4", 32, 8), ("v6e-8", "v6e:2x4", 8, 1)])
def test_slices_are_named_as_gcloud_names_them(name, topology_name, chips, hosts):
  tpu = topology.parse(name)
  assert (tpu.topology_name, tpu.chips, tpu.hosts) == (topology_name, chips, hosts)


@pytest.mark.parametrize("name,message", [
    ("v5p-6", "valid: v5p-8, v5p-16"), ("tpu-8", "GENERATION one of v4, v5p")])
def test_an_unknown_slice_names_the_valid_ones(name, message):
  with pytest.raises(InputError, match=message):
    topology.parse(name)


@pytest.mark.parametrize("name,chips,hosts,kind", [
    ("8xH100", 8, 1, "NVIDIA H100 80GB HBM3"), ("4xh200", 4, 1, "NVIDIA H200"),
    ("16xH100", 16, 2, "NVIDIA H100 80GB HBM3")])
def test_gpus_are_named_count_x_model(name, chips, hosts, kind):
  gpus = topology.parse(name)
  assert (gpus.chips, gpus.hosts, gpus.device_kind) == (chips, hosts, kind)
  assert gpus.hbm_gib < topology.GPUS[gpus.model][2] / 2**30  # JAX's default share.


@pytest.mark.parametrize("name", ["12xH100", "8xV100", "0xH100"])
def test_unknown_gpus_name_the_valid_ones(name):
  with pytest.raises(InputError, match="MODEL one of H100, H200"):
    topology.parse(name)


def _run(*args):
  return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=900)


@needs_libtpu
@pytest.mark.parametrize("name,hbm_gib", [("v5litepod-4", 16), ("v4-8", 32)])
def test_the_smoke_config_compiles_for_a_slice_and_fits(name, hbm_gib):
  out = _run("transformer_jax.benchmark", SMOKE, f"--topology={name}", "--json")
  assert out.returncode == 0, out.stderr[-3000:]
  figures = json.loads(out.stdout)
  assert figures["devices"] == 4 and figures["device_kind"].startswith("TPU v")
  assert figures["fits"] and figures["hbm_gib"] == hbm_gib
  assert 0 < figures["total_gib"] < 0.1 and figures["arguments_gib"] > 0
  assert 0 < figures["eval_total_gib"] < 0.1  # The eval step, compiled too,
  assert 0 < figures["beam_search_total_gib"] < 0.1  # and beam search.
  assert figures["roofline_step_s"] > 0 and figures["flops_per_chip"] > 0
  assert figures["estimated_step_s"] in (figures["compiler_step_s"], figures["roofline_step_s"])
  assert "a cost model, not a measurement" in out.stderr
  assert "compilation cache" not in out.stderr, out.stderr[-3000:]


@needs_cuda_plugin
def test_the_smoke_config_compiles_for_gpus_without_one_and_fits():
  out = _run("transformer_jax.benchmark", SMOKE, "--topology=4xH200", "--json")
  assert out.returncode == 0, out.stderr[-3000:]
  figures = json.loads(out.stdout)
  assert figures["devices"] == 4 and figures["device_kind"] == "NVIDIA H200"
  assert figures["fits"] and 100 < figures["hbm_gib"] < 141
  assert 0 < figures["total_gib"] < 0.1 and 0 < figures["eval_total_gib"] < 0.1
  assert 0 < figures["beam_search_total_gib"] < 0.1
  assert "4xH200 (4 chips, 1 host(s))" in out.stderr and ": fits" in out.stderr


@needs_libtpu
@pytest.mark.parametrize("option,instead", [("model.norm_kernel=pallas", "xla"),
                                            ("model.ffn_kernel=pallas", "xla"),
                                            ("train.loss_kernel=hybrid", "pallas")])
def test_a_gpu_only_kernel_is_refused_on_a_slice_in_one_line(option, instead):
  """The residual norm's, the feed-forward layer's and the hybrid loss's Pallas kernels
  have no TPU version: one line and exit 2, not a compiler traceback."""
  out = _run("transformer_jax.benchmark", SMOKE, f"--config.{option}",
             "--topology=v5litepod-4")
  assert out.returncode == 2, out.stderr[-3000:]
  name, value = option.split("=")
  assert out.stderr.strip().splitlines()[-1] == (
      f"error: config.{name}='{value}' has GPU kernels (Pallas on Triton) and no "
      f"TPU kernel yet: use '{instead}' on TPUs.")


@needs_libtpu
def test_the_fused_loss_compiles_into_a_slices_step_as_mosaic_kernels():
  """train.loss_kernel=pallas on a TPU slice: the step compiles, with the TPU kernels
  (kernels/vocabulary_loss_tpu.py) on each chip's rows; the GPU's Triton kernels do not
  lower for a TPU."""
  out = _run("transformer_jax.benchmark", SMOKE, "--config.train.loss_kernel=pallas",
             "--topology=v5litepod-4", "--json")
  assert out.returncode == 0, out.stderr[-3000:]
  assert "loss pallas" in out.stderr and ": fits" in out.stderr
  assert json.loads(out.stdout)["total_gib"] > 0


@needs_libtpu
@pytest.mark.slow
def test_a_config_too_large_is_refused_in_one_line_naming_what_fits(tmp_path):
  out = _run("transformer_jax.benchmark", SMOKE, *HUGE, "--topology=v5litepod-4")
  assert out.returncode == 2, out.stderr[-3000:]
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith("error: does not fit v5litepod-4 (16 GiB of HBM a chip)")
  assert last.endswith("--config.train.mesh_shape=(1,-1,1) fits")

  # The launcher's trial fits in no way (4 times the FFN: 8.6 billion parameters), so
  # each alternative fails early in the TPU compiler instead of compiling in full.
  no_way = {**HUGE_FIELDS, "model.d_ff": 4 * HUGE_FIELDS["model.d_ff"]}
  experiment = tmp_path / "huge.py"
  experiment.write_text('"""One trial too large for the chip."""\nfrom launch import sweep\n'
                        'CONFIG = "configs/transformer.py:numbers"\n'
                        f'def trials():\n  return sweep.named(huge={no_way!r})\n')
  out = _run("launch", f"--experiment={experiment}", "--target=tpu", "--tpu_name=t",
             "--zone=us-east5-a", "--accelerator_type=v5litepod-4", f"--root={tmp_path}",
             "--smoke", "--dry_run")
  assert out.returncode == 2, out.stdout + out.stderr[-3000:]
  assert "create" not in out.stdout  # Refused before any TPU is created.
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith("error: huge: does not fit v5litepod-4") and "--skip_fit_check" in last
  assert "nor with FSDP or 2-4x the microbatches" in last


@needs_libtpu
@pytest.mark.skipif(bool(glob.glob("/dev/accel*") + glob.glob("/dev/nvidia[0-9]*")),
                    reason="a machine with accelerators")
def test_a_cpu_machine_with_libtpu_installed_starts_without_its_tpu_probe_errors():
  """libtpu (for the compile-only slices) would probe for TPUs at each start and print
  five lines of errors; on a machine with no TPU or GPU the commands run on the CPU
  quietly, and still compile for a slice. The smoke config's programs for v5litepod-4
  were compiled before (test_the_smoke_config_compiles_for_a_slice_and_fits): they are
  not read from JAX's persistent cache (compile-only devices cannot load them, and each
  read would warn)."""
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  for flags in (["--aot"], ["--topology=v5litepod-4"]):
    out = subprocess.run([sys.executable, "-m", "transformer_jax.benchmark", SMOKE, *flags],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "TPU_WORKER_HOSTNAMES" not in out.stderr and "host bounds" not in out.stderr, (
        out.stderr[-3000:])
    assert "compilation cache" not in out.stderr, out.stderr[-3000:]

