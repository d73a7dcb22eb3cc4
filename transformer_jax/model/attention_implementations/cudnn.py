"""cuDNN's fused attention (model.attention_implementation "cudnn"; "auto" picks it
where its limits allow): a GPU in bfloat16 or float16, no dropout on the attention
weights, d_k = d_v, a head size that is a multiple of 8 up to 128.

It gets the mask as sequence lengths and `is_causal`, which it applies inside the
kernel; a dense mask would reach it as an additive [batch, 1, q, k] bias (and that
bias's gradient). Packed rows have no such form in JAX's public API and take XLA.
"""

from __future__ import annotations

import jax

from transformer_jax.config import ATTENTION
from transformer_jax.model.attention import Implementation
from transformer_jax.model.attention_implementations import xla


@ATTENTION.register("cudnn")
class Cudnn(Implementation):
  """jax.nn.dot_product_attention by cuDNN: masks as sequence lengths, no bias."""

  platforms = ("gpu",)
  dtypes = ("bfloat16", "float16")
  auto = True
  packed_rows = ("cuDNN for unpacked batches; packed rows (train.batching='packed') take "
                 "XLA, since JAX's public API has no cuDNN segment mask")
  compiled_as = "fmha"  # __cudnn$fmhaSoftmax, __cudnn$fmhaSoftmaxBackward.

  def attend(self, q, k, v, mask):
    if mask is None:
      return jax.nn.dot_product_attention(q, k, v, implementation="cudnn")
    if mask.packed:
      return xla.Xla().attend(q, k, v, mask)
    query_lengths, key_lengths = mask.seq_lengths()
    return jax.nn.dot_product_attention(
        q, k, v, is_causal=mask.causal, query_seq_lengths=query_lengths,
        key_value_seq_lengths=key_lengths, implementation="cudnn")

  def fits(self, cfg, platform):
    return (super().fits(cfg, platform) and cfg.attention_dropout_rate == 0
            and cfg.qk_dim == cfg.head_dim and cfg.head_dim % 8 == 0
            and cfg.head_dim <= 128)

  def missing_library(self, error, target):
    if "cuDNN not found" not in str(error):  # Lowering it needs cuDNN's library.
      return None
    return (f"compiling cuDNN's attention{' for ' + target if target else ''} needs "
            "cuDNN's library, which is not installed here: pip install nvidia-cudnn-cu13 "
            "(nvidia-cudnn-cu12 with CUDA 12), or model.attention_implementation='xla' "
            "(cuDNN's then estimated).")
