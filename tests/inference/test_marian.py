"""MarianMT's weights from this project's parameters and back (inference/marian.py):
exact both ways, in every layout; the model dimension's order is MarianMT's sinusoids'."""

import dataclasses

import flax.linen as nn
import jax
import numpy as np
import pytest

from transformer_jax.inference import marian
from transformer_jax.model.transformer import init_params, sinusoidal_position_encoding
from transformer_jax.model.transformer import Transformer


@pytest.mark.parametrize("d_model", [8, 9, 512])
def test_the_model_dimension_is_permuted_to_marians_sinusoids(d_model):
  """transformers' MarianSinusoidalPositionalEmbedding.create_weight, written out:
  sin(pos / 10000^(2 (j // 2) / d)) of the even j in the first ceil(d / 2) columns,
  cos of the odd j in the rest. Sec. 3.5's table, its columns in hidden_order, is it."""
  pos = np.arange(64)[:, None] / np.power(
      10000, 2 * (np.arange(d_model) // 2) / d_model)[None, :]
  sentinel = (d_model + 1) // 2
  theirs = np.zeros((64, d_model))
  theirs[:, :sentinel], theirs[:, sentinel:] = np.sin(pos[:, 0::2]), np.cos(pos[:, 1::2])
  ours = sinusoidal_position_encoding(64, d_model)
  np.testing.assert_allclose(ours[:, marian.hidden_order(d_model)], theirs, atol=1e-6)


@pytest.mark.parametrize("changes", [
    {}, {"scan_layers": True},
    {"share_embeddings": False, "attention_bias": True, "logits_bias": True,
     "activation": "swish"}])
def test_marian_tensors_and_back_are_the_same_parameters_bit_for_bit(tiny_model_config,
                                                                    changes):
  """Every parameter (random values, biases included) survives the trip to MarianMT's
  tensors and back exactly, with OPUS-MT's numbering of the vocabulary (padding last,
  EOS 0, unknown 1); the tensors have MarianMT's names and shapes."""
  cfg = dataclasses.replace(tiny_model_config, vocab_multiple=1, **changes)
  params = nn.meta.unbox(init_params(Transformer(cfg), jax.random.key(0)))
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  params = jax.tree.unflatten(tree, [np.asarray(jax.random.normal(k, x.shape), np.float32)
                                     for k, x in zip(keys, leaves)])
  vocab, d = cfg.vocab_size, cfg.d_model
  ids = [vocab - 1, 0, 1, *range(2, vocab - 1)]
  tensors = marian.marian_tensors(params, cfg, ids)
  back = marian.params_from_marian(tensors, cfg, ids)
  assert jax.tree.structure(back) == jax.tree.structure(params)
  for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params)):
    assert a.dtype == b.dtype and np.array_equal(a, b)
  embeddings = ["model.shared.weight"] if cfg.share_embeddings else [
      "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
      "lm_head.weight"]
  for name in embeddings:
    assert tensors[name].shape == (vocab, d)
  assert tensors["final_logits_bias"].shape == (1, vocab)
  layer = "model.decoder.layers.0."
  assert tensors[layer + "encoder_attn.q_proj.weight"].shape == (d, d)
  assert tensors[layer + "fc1.weight"].shape == (cfg.d_ff, d)
  assert tensors[layer + "fc2.weight"].shape == (d, cfg.d_ff)
  # Marian's id 0 (EOS) is this project's id 1: its row, in Marian's dimension order.
  table = params["embed"]["embedding"] if cfg.share_embeddings else params[
      "source_embed"]["embedding"]
  np.testing.assert_array_equal(tensors[embeddings[0]][0],
                                table[1][marian.hidden_order(d)])
