"""The kernels' table (transformer_jax/kernels/__init__.py) says what each option's
kernels are: each names a module that exists, every pallas_call of that module is in the
table with its products, and the options and values it names are the config's."""

import os
import re

import pytest

from conftest import ROOT
from transformer_jax import config as config_lib, kernels

FOLDER = os.path.join(ROOT, "transformer_jax", "kernels")


def _calls(module: str) -> set[str]:
  text = open(os.path.join(FOLDER, f"{module}.py"), encoding="utf-8").read()
  return set(re.findall(r'name="(\w+)"\)\(', text))


def test_every_pallas_call_is_in_the_table_under_its_option():
  modules = {k.module for k in kernels.KERNELS}
  modules |= {f"{m}_tpu" for m in modules if os.path.exists(os.path.join(FOLDER, f"{m}_tpu.py"))}
  named = set().union(*map(_calls, modules))
  assert named and named == set(kernels.products()), (named, set(kernels.products()))
  for kernel in kernels.KERNELS:  # model.norm_kernel: residual_norm.py, and so on.
    assert kernel.option.split(".")[1].removesuffix("_kernel") in kernel.module, kernel


def test_the_table_names_real_options_and_values():
  cfg = config_lib.Config()
  for kernel in kernels.KERNELS:
    section, name = kernel.option.split(".")
    assert hasattr(getattr(cfg, section), name), kernel.option
    valid = config_lib.LOSS_KERNELS if name == "loss_kernel" else config_lib.KERNELS
    assert kernel.value in valid, kernel


@pytest.mark.parametrize("option, value, instead", [
    ("train.loss_kernel", "hybrid", "pallas"), ("model.norm_kernel", "pallas", "xla"),
    ("model.ffn_kernel", "pallas", "xla")])
def test_a_kernel_without_tpu_kernels_is_refused_naming_what_has_them(option, value, instead):
  kernel, = kernels.selected({option: value})
  assert kernels.refusal(kernel, "gpu") is None
  assert kernels.refusal(kernel, "tpu") == (
      f"config.{option}='{value}' has GPU kernels (Pallas on Triton) and no TPU kernel "
      f"yet: use '{instead}' on TPUs.")


def test_the_fused_loss_has_kernels_for_gpus_and_tpus():
  kernel, = kernels.selected({"train.loss_kernel": "pallas"})
  assert kernels.refusal(kernel, "tpu") is None and kernels.refusal(kernel, "gpu") is None
