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


def _module_calls(module: str) -> set[str]:
  """The pallas_calls of kernels/<module>.py and, where it has one, its TPU sibling's."""
  tpu = f"{module}_tpu"
  return _calls(module) | (_calls(tpu) if os.path.exists(os.path.join(FOLDER, f"{tpu}.py"))
                           else set())


def test_every_pallas_call_is_in_the_table_under_its_option():
  named = set().union(*(_module_calls(k.module) for k in kernels.KERNELS))
  assert named and named == set(kernels.products()), (named, set(kernels.products()))
  for kernel in kernels.KERNELS:  # Each row's calls are its own module's.
    assert kernel.products and set(kernel.products) <= _module_calls(kernel.module), kernel


def test_the_table_names_real_options_and_the_config_takes_exactly_its_values():
  """Each kernel option's choices in the config are "xla" and its rows' values, no more,
  and the table's names are unique (the benchmarks' --kernels)."""
  cfg = config_lib.Config()
  options = {k.option for k in kernels.KERNELS}
  assert options == set(config_lib.KERNEL_CHOICES)
  for option in options:
    section, name = option.split(".")
    assert hasattr(getattr(cfg, section), name), option
    values = {k.value for k in kernels.KERNELS if k.option == option}
    assert set(config_lib.KERNEL_CHOICES[option]) == {"xla"} | values, option
    assert kernels.option_values(cfg)[option] == getattr(getattr(cfg, section), name)
  names = [k.name for k in kernels.KERNELS]
  assert len(set(names)) == len(names), names


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
