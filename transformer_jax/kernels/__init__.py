"""Pallas kernels XLA does not write (run by Pallas's interpreter on a CPU), each selected
by a config option. KERNELS, the one table of them, says for each what it computes, on
which platforms it has kernels, and the products of its first two operands that each of
its pallas_calls runs (what planning/roofline.py counts, since a custom call's FLOPs
are not in the program); the config's KERNEL_CHOICES are the values each option takes,
and the benchmarks' flags and checks are read from it.
The modules: `vocabulary_loss` (GPUs, Triton) and `vocabulary_loss_tpu` (TPUs, Mosaic) for
train.loss_kernel, `residual_norm` for model.norm_kernel, `ffn` for model.ffn_kernel;
`tiles`, the arithmetic they share on a tile; `placement`, where a kernel runs."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Kernel:
  name: str  # Short: the benchmarks' --kernels and kernel_check's rows.
  option: str  # The config field, "section.name".
  value: str  # The field's value that selects it.
  module: str  # kernels/<module>.py (GPUs; a TPU module adds "_tpu").
  computes: str
  platforms: tuple[str, ...]  # Where it has kernels: "gpu", "tpu".
  # pallas_call name -> products of its first two operands, [rows, d] by [n, d] (2 rows
  # n d FLOPs each).
  products: dict[str, int]


# What this project's Pallas kernels are compiled with on each platform.
PALLAS_COMPILERS = {"gpu": "Triton", "tpu": "Mosaic"}
KERNELS = (
    Kernel("loss", "train.loss_kernel", "pallas", "vocabulary_loss",
           "the output projection and its label-smoothed loss, never writing the logits",
           ("gpu", "tpu"), {"vocabulary_loss_forward": 1, "vocabulary_loss_grad_h": 2,
                            "vocabulary_loss_grad_w": 2}),
    Kernel("hybrid", "train.loss_kernel", "hybrid", "vocabulary_loss",
           "the fused forward, and one kernel writing the logits' gradient for cuBLAS's "
           "two products", ("gpu",), {"vocabulary_loss_grad_logits": 1}),
    Kernel("norm", "model.norm_kernel", "pallas", "residual_norm",
           "LayerNorm(x + Dropout(s)), the post-norm residual, one pass each way",
           ("gpu",), {"residual_norm_forward": 0, "residual_norm_backward": 0}),
    Kernel("ffn", "model.ffn_kernel", "pallas", "ffn",
           "the feed-forward layer's ReLU gradient inside its second product's",
           ("gpu",), {"ffn_relu_product_grad": 1}),
)


def products() -> dict[str, int]:
  """Every kernel's products by its pallas_call name (Kernel.products)."""
  return {name: count for kernel in KERNELS for name, count in kernel.products.items()}


def option_values(cfg: Any) -> dict[str, str]:
  """Each kernel option's value in the config `cfg`: {"train.loss_kernel": "xla", ...}."""
  return {k.option: getattr(getattr(cfg, k.option.split(".")[0]), k.option.split(".")[1])
          for k in KERNELS}


def selected(values: dict[str, str]) -> list[Kernel]:
  """The kernels that config values {option: value} select."""
  return [k for k in KERNELS if values.get(k.option) == k.value]


def refusal(kernel: Kernel, platform: str) -> str | None:
  """One line if `kernel` has no kernels for `platform`, naming what to use instead: the
  same option's value that has them, else "xla"."""
  if platform in kernel.platforms:
    return None
  instead = next((k.value for k in KERNELS if k.option == kernel.option
                  and platform in k.platforms), "xla")
  has = " and ".join(f"{p.upper()} kernels (Pallas on {PALLAS_COMPILERS[p]})"
                     for p in kernel.platforms)
  return (f"config.{kernel.option}={kernel.value!r} has {has} and no {platform.upper()} "
          f"kernel yet: use {instead!r} on {platform.upper()}s.")
