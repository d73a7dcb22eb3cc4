"""cuDNN attention for the GPU, checked on the CPU: the train step and beam search
lowered for CUDA (`lower(lowering_platforms=("cuda",))`, no GPU needed), and the
sequence-length mask that cuDNN receives computes what the dense mask computes."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.cudnn import fused_attention_stablehlo

from conftest import smoke_config
from transformer_jax import config as config_lib, partitioning
from transformer_jax.model import beam_search
from transformer_jax.model.attention import attention_implementation
from transformer_jax.model.transformer import Transformer
from transformer_jax.training import run as run_lib

CUDNN_CALL = re.compile(r"stablehlo\.custom_call @(__cudnn\$\w+)\(([^)]*)\)")


@pytest.fixture
def cudnn_version(monkeypatch):
  """JAX asks the installed cuDNN for its version before it lowers to cuDNN; this CPU
  has none, so answer as the GPU image's cuDNN 9.10 would."""
  monkeypatch.setattr(fused_attention_stablehlo, "check_cudnn_version", lambda: 91000)


def _cudnn_calls(lowered) -> list[tuple[str, int]]:
  """(custom call target, operand count) of every cuDNN attention call."""
  return [(target, len(operands.split(","))) for target, operands in
          CUDNN_CALL.findall(lowered.as_text())]


def _cudnn_cfg(**model) -> config_lib.Config:
  return smoke_config(model={"dtype": "bfloat16", "attention_implementation": "cudnn",
                             "d_model": 64, "num_heads": 4, **model})


def test_train_step_lowered_for_cuda_runs_cudnn_attention_without_a_bias(cudnn_version):
  """Every attention of the train step (encoder, causal decoder, cross-attention; forward
  and backward) is a cuDNN fused call with q, k, v and two sequence-length operands: no
  [batch, 1, q, k] bias (a bias call is __cudnn$fmhaScaleBiasSoftmax)."""
  cfg = _cudnn_cfg()
  mesh = partitioning.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  run, state = run_lib.make_run(cfg, mesh, abstract=True)
  shape = jax.ShapeDtypeStruct((8, 16), jnp.int32, sharding=partitioning.batch_sharding(mesh))
  key = jax.ShapeDtypeStruct((), run.dropout_key.dtype,
                             sharding=partitioning.replicated(mesh))
  with run.activate():
    lowered = run.train_step.trace(state, {"inputs": shape, "targets": shape},
                                   key).lower(lowering_platforms=("cuda",))
  calls = _cudnn_calls(lowered)
  layers = cfg.model.num_encoder_layers + 2 * cfg.model.num_decoder_layers
  assert sorted(calls) == sorted([("__cudnn$fmhaSoftmax", 5)] * layers +
                                 [("__cudnn$fmhaSoftmaxBackward", 8)] * layers), calls


def test_beam_search_lowered_for_cuda_encodes_with_cudnn_attention(cudnn_version):
  """The encoder of `generate` uses cuDNN's fused call, with lengths and no bias; the
  decoding steps attend to their cache with one query each (plain XLA products)."""
  cfg = _cudnn_cfg()
  model = Transformer(cfg.model)
  x = jnp.ones((4, 12), jnp.int32)
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), x, x))["params"]
  lowered = beam_search.generate.trace(params, x, model=model, beam_size=4, alpha=0.6,
                                       max_extra_length=8, eos_id=1).lower(
                                      lowering_platforms=("cuda",))
  calls = _cudnn_calls(lowered)
  assert calls == [("__cudnn$fmhaSoftmax", 5)] * cfg.model.num_encoder_layers, calls


def test_auto_picks_cudnn_only_on_a_gpu_in_bfloat16(tiny_model_config):
  auto = dataclasses.replace(tiny_model_config, attention_implementation="auto",
                             dtype="bfloat16")
  assert jax.default_backend() == "cpu" and attention_implementation(auto) == "xla"
  assert attention_implementation(dataclasses.replace(auto, attention_implementation="")) \
      == "xla"


@pytest.mark.parametrize("change, picked", [
    ({}, "cudnn"), ({"dtype": "float32"}, "xla"), ({"attention_dropout_rate": 0.1}, "xla"),
    ({"key_dim": 8}, "xla"), ({"d_model": 48}, "xla"), ({"d_model": 544}, "xla")],
    ids=["fits", "float32", "attention_dropout", "d_k_not_d_v", "head_12", "head_136"])
def test_auto_on_a_gpu_picks_cudnn_within_its_limits(monkeypatch, change, picked):
  """On a GPU (JAX's default backend says so), "auto" takes cuDNN's attention in
  bfloat16 with no attention dropout, d_k = d_v, and a head size a multiple of 8 up to
  128; outside any of those, XLA's."""
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  cfg = config_lib.ModelConfig(**{"d_model": 256, "num_heads": 4, "dtype": "bfloat16",
                                  "attention_implementation": "auto", **change})
  assert attention_implementation(cfg) == picked


def test_sequence_length_masks_compute_what_dense_masks_compute(monkeypatch):
  """The model in its cuDNN form (padding as lengths, the decoder's causal flag) run
  through XLA on the CPU gives the logits of the dense-mask form at every real target
  position, for rows with different source and target padding."""
  cfg = smoke_config(model={"d_model": 64, "num_heads": 4, "dropout_rate": 0.0})
  dense_model = Transformer(cfg.model)
  lengths_model = Transformer(config_lib.ModelConfig(
      **{**cfg.model.__dict__, "attention_implementation": "cudnn"}))
  real = jax.nn.dot_product_attention
  seen, lengths = [], []
  def through_xla(*args, **kwargs):  # cuDNN's call, computed by XLA's kernel.
    seen.append(kwargs.get("query_seq_lengths") is not None)
    if seen[-1]:
      lengths.append((kwargs["query_seq_lengths"], kwargs["key_value_seq_lengths"]))
    return real(*args, **{**kwargs, "implementation": "xla"})
  monkeypatch.setattr(jax.nn, "dot_product_attention", through_xla)

  rng = np.random.default_rng(0)
  src = rng.integers(3, cfg.model.vocab_size, (3, 11))
  tgt = rng.integers(3, cfg.model.vocab_size, (3, 9))
  for row, (s, t) in enumerate([(11, 9), (4, 7), (1, 2)]):  # Padding at the ends.
    src[row, s:], tgt[row, t:] = 0, 0
  params = dense_model.init(jax.random.key(0), src, tgt)["params"]
  expected = dense_model.apply({"params": params}, src, tgt)
  assert seen and not any(seen)
  seen.clear()
  got = lengths_model.apply({"params": params}, src, tgt)
  layers = cfg.model.num_encoder_layers + 2 * cfg.model.num_decoder_layers
  assert len(seen) == layers and all(seen)  # Every attention passed lengths,
  src_len, tgt_len = [11, 4, 1], [9, 7, 2]  # the real tokens' counts, padding left out:
  passed = ([(src_len, src_len)] * cfg.model.num_encoder_layers +
              [(tgt_len, tgt_len), (tgt_len, src_len)] * cfg.model.num_decoder_layers)
  assert [(list(map(int, q)), list(map(int, k))) for q, k in lengths] == passed
  real_tokens = np.asarray(tgt != 0)
  np.testing.assert_allclose(np.asarray(got)[real_tokens], np.asarray(expected)[real_tokens],
                             atol=1e-5)
