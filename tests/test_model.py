"""The model against the paper (Vaswani et al. 2017, Sec. 3)."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax import tokenizer
from transformer_jax.config import ModelConfig
from transformer_jax.model import PAD_ID, Transformer, shift_right, sinusoidal_position_encoding


def _init(cfg, rng, src_len=7, tgt_len=6):
  model = Transformer(cfg)
  ones = lambda n: jnp.ones((2, n), jnp.int32)
  return model, nn.meta.unbox(model.init(rng, ones(src_len), ones(tgt_len))["params"])


def _tokens(seed, shape, vocab=37):
  return jax.random.randint(jax.random.key(seed), shape, 3, vocab)


def test_pad_id_agrees_with_tokenizer():
  assert PAD_ID == tokenizer.PAD_ID


def test_sinusoidal_encoding_is_the_papers_formula():
  """Sec. 3.5: PE(pos, 2i) = sin(pos/10000^(2i/d)), PE(pos, 2i+1) = cos(...)."""
  d = 16
  table = sinusoidal_position_encoding(50, d)
  for pos in (0, 1, 7, 49):
    for i in range(d // 2):
      angle = pos / 10000 ** (2 * i / d)
      np.testing.assert_allclose(table[pos, 2 * i], np.sin(angle), atol=1e-6)
      np.testing.assert_allclose(table[pos, 2 * i + 1], np.cos(angle), atol=1e-6)


def test_base_parameter_count_matches_the_paper_layout(rng):
  """Table 3 base: 6+6 layers, d=512, d_ff=2048, h=8, shared embeddings (Sec. 3.4).

  Encoder layer 4d^2 + 2 d d_ff weights, decoder layer 8d^2 + 2 d d_ff, one V x d
  embedding; plus FFN biases and LayerNorm scales and offsets.
  """
  cfg = ModelConfig(vocab_size=37000)
  shapes = jax.eval_shape(lambda: Transformer(cfg).init(
      rng, jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32)))
  count = sum(x.size for x in jax.tree.leaves(nn.meta.unbox(shapes)))
  d, f, v = 512, 2048, 37000
  ffn_bias, norm = f + d, 2 * d
  expected = (6 * (4 * d * d + 2 * d * f + ffn_bias + 2 * norm) +
              6 * (8 * d * d + 2 * d * f + ffn_bias + 3 * norm) + v * d)
  assert count == expected
  assert 60e6 < count < 66e6  # The paper reports 65M.


def test_untied_embeddings_make_three_matrices(tiny_model_config, rng):
  cfg = dataclasses.replace(tiny_model_config, share_embeddings=False)
  _, params = _init(cfg, rng)
  assert {"source_embed", "target_embed", "logits"} <= set(params)
  _, shared = _init(tiny_model_config, rng)
  assert "embed" in shared and "logits" not in shared


def test_later_target_tokens_do_not_change_earlier_logits(tiny_model_config, rng):
  """Sec. 3.2.3: decoder self-attention cannot see later positions."""
  model, params = _init(tiny_model_config, rng)
  src, tgt = _tokens(1, (2, 7)), _tokens(2, (2, 6))
  changed = tgt.at[:, 4].set((tgt[:, 4] + 1) % 30 + 3)
  a = model.apply({"params": params}, src, tgt)
  b = model.apply({"params": params}, src, changed)
  # Target token 4 is the decoder's input at position 5 only (shifted right).
  np.testing.assert_allclose(a[:, :5], b[:, :5], atol=1e-6)
  assert not np.allclose(a[:, 5], b[:, 5], atol=1e-4)


def test_padding_does_not_change_outputs_at_real_positions(tiny_model_config, rng):
  """Padding keys are never attended: extra pad tokens change nothing real."""
  model, params = _init(tiny_model_config, rng)
  src, tgt = _tokens(1, (2, 5)), _tokens(2, (2, 4))
  pad = lambda x, n: jnp.pad(x, ((0, 0), (0, n)), constant_values=PAD_ID)
  short = model.apply({"params": params}, src, tgt)
  long = model.apply({"params": params}, pad(src, 6), pad(tgt, 3))
  np.testing.assert_allclose(short, long[:, :4], atol=1e-5)


def test_packed_sentences_do_not_attend_across(tiny_model_config, rng):
  """Two pairs packed in one row give the same logits as each pair alone."""
  model, params = _init(tiny_model_config, rng)
  src_a, tgt_a = _tokens(1, (1, 4)), _tokens(2, (1, 3))
  src_b, tgt_b = _tokens(3, (1, 5)), _tokens(4, (1, 4))
  alone_a = model.apply({"params": params}, src_a, tgt_a)
  alone_b = model.apply({"params": params}, src_b, tgt_b)
  packed = model.apply(
      {"params": params},
      jnp.concatenate([src_a, src_b, jnp.zeros((1, 2), jnp.int32)], 1),
      jnp.concatenate([tgt_a, tgt_b, jnp.zeros((1, 1), jnp.int32)], 1),
      inputs_positions=jnp.array([[0, 1, 2, 3, 0, 1, 2, 3, 4, 0, 0]]),
      targets_positions=jnp.array([[0, 1, 2, 0, 1, 2, 3, 0]]),
      inputs_segmentation=jnp.array([[1, 1, 1, 1, 2, 2, 2, 2, 2, 0, 0]]),
      targets_segmentation=jnp.array([[1, 1, 1, 2, 2, 2, 2, 0]]))
  np.testing.assert_allclose(packed[:, :3], alone_a, atol=1e-5)
  np.testing.assert_allclose(packed[:, 3:7], alone_b, atol=1e-5)


def test_shift_right_starts_each_packed_sentence_fresh():
  targets = jnp.array([[5, 6, 7, 8, 9, 0]])
  segments = jnp.array([[1, 1, 2, 2, 2, 0]])
  np.testing.assert_array_equal(shift_right(targets), [[0, 5, 6, 7, 8, 9]])
  np.testing.assert_array_equal(shift_right(targets, segments), [[0, 5, 0, 7, 8, 0]])


def test_dropout_is_active_only_in_training(tiny_model_config, rng):
  model, params = _init(tiny_model_config, rng)
  src, tgt = _tokens(1, (2, 7)), _tokens(2, (2, 6))
  run = lambda seed: model.apply({"params": params}, src, tgt, deterministic=False,
                                 rngs={"dropout": jax.random.key(seed)})
  assert not np.allclose(run(0), run(1))
  np.testing.assert_array_equal(model.apply({"params": params}, src, tgt),
                                model.apply({"params": params}, src, tgt))


def test_explicit_attention_path_matches_fused_attention(tiny_model_config, rng):
  """The attention-dropout path (spelled out) computes the same attention."""
  cfg = dataclasses.replace(tiny_model_config, dropout_rate=0.0,
                            attention_dropout_rate=1e-9)  # Keeps every weight.
  model, params = _init(cfg, rng)
  src, tgt = _tokens(1, (2, 7)), _tokens(2, (2, 6))
  fused = model.apply({"params": params}, src, tgt)
  explicit = model.apply({"params": params}, src, tgt, deterministic=False,
                         rngs={"dropout": jax.random.key(0)})
  np.testing.assert_allclose(fused, explicit, atol=1e-5)


@pytest.mark.parametrize("share", [True, False])
def test_a_padded_vocabulary_gives_the_same_logits(tiny_model_config, rng, share):
  """GPU/TPU option: the embedding padded to 128 rows; the padded
  ids are never predicted and the real ones score as without padding."""
  cfg = dataclasses.replace(tiny_model_config, dropout_rate=0.0, share_embeddings=share)
  padded_cfg = dataclasses.replace(cfg, vocab_multiple=128)
  model, params = _init(cfg, rng)
  padded_model, padded = _init(padded_cfg, rng)
  # The same weights: each unpadded array in the leading corner of its padded twin.
  padded = jax.tree.map(lambda a, b: b.at[tuple(slice(0, n) for n in a.shape)].set(a),
                        params, padded)
  shapes = [x.shape for x in jax.tree.leaves(padded)]
  assert (128, cfg.d_model) in shapes or (cfg.d_model, 128) in shapes
  src, tgt = _tokens(1, (2, 7)), _tokens(2, (2, 6))
  expected = model.apply({"params": params}, src, tgt)
  got = padded_model.apply({"params": padded}, src, tgt)
  assert got.shape == expected.shape == (2, 6, 37)
  np.testing.assert_allclose(got, expected, atol=1e-6)


def test_attention_implementation_xla_matches_the_default(tiny_model_config, rng):
  """The 'cudnn' kernel needs a GPU; on CPU the named 'xla' path equals the default."""
  model, params = _init(tiny_model_config, rng)
  xla = Transformer(dataclasses.replace(tiny_model_config, attention_implementation="xla"))
  src, tgt = _tokens(1, (2, 7)), _tokens(2, (2, 6))
  np.testing.assert_array_equal(model.apply({"params": params}, src, tgt),
                                xla.apply({"params": params}, src, tgt))


@pytest.mark.parametrize("option", ["pre_norm", "learned_positions"])
def test_options_build_and_differ_from_the_paper_default(tiny_model_config, rng, option):
  cfg = dataclasses.replace(tiny_model_config, **{option: True})
  model, params = _init(cfg, rng)
  out = model.apply({"params": params}, _tokens(1, (2, 7)), _tokens(2, (2, 6)))
  assert out.shape == (2, 6, 37) and np.isfinite(out).all()
  if option == "learned_positions":
    assert "position_embedding" in params["source_embedder"]
  else:
    assert "encoder_norm" in params and "decoder_norm" in params


def test_bfloat16_compute_keeps_float32_parameters_and_logits(tiny_model_config, rng):
  cfg = dataclasses.replace(tiny_model_config, dtype="bfloat16")
  model, params = _init(cfg, rng)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
  src, tgt = _tokens(1, (2, 7)), _tokens(2, (2, 6))
  low = model.apply({"params": params}, src, tgt)
  full = Transformer(tiny_model_config).apply({"params": params}, src, tgt)
  assert low.dtype == jnp.float32
  np.testing.assert_allclose(low, full, atol=0.15)
  assert not np.array_equal(low, full)  # bfloat16 really was used.


def test_smaller_key_dim_changes_only_queries_and_keys(tiny_model_config, rng):
  """Table 3 (B): d_k below d_model / h, with d_v unchanged."""
  cfg = dataclasses.replace(tiny_model_config, key_dim=4)
  model, params = _init(cfg, rng)
  attention = params["encoder_0"]["self_attention"]
  assert attention["query"].shape == attention["key"].shape == (32, 4, 4)
  assert attention["value"].shape == (32, 4, 8)
  src, tgt = _tokens(1, (2, 7)), _tokens(2, (2, 6))
  out = model.apply({"params": params}, src, tgt)
  assert out.shape == (2, 6, 37) and np.isfinite(out).all()
  # The cached decoder agrees with the full pass on this path too.
  from transformer_jax import decode
  encoded = model.apply({"params": params}, src, method=Transformer.encode)
  cache = decode.init_cache(model, params, encoded, src, 6)
  step, _ = decode._transformer_logits_fn(model, params, encoded, src)(
      jnp.zeros((2, 1), jnp.int32), cache, jnp.array(0))
  np.testing.assert_allclose(step, out[:, 0], atol=1e-5)


@pytest.mark.slow
def test_scanned_layers_equal_the_unrolled_stack(tiny_model_config, rng):
  """Option model.scan_layers: the same parameters, stacked on a
  leading layers axis, give the same logits and the same beam search."""
  from transformer_jax import decode
  cfg = dataclasses.replace(tiny_model_config, dropout_rate=0.0)
  model, params = _init(cfg, rng)
  scanned = Transformer(dataclasses.replace(cfg, scan_layers=True))
  stack = lambda prefix, n: {"layer": jax.tree.map(
      lambda *xs: jnp.stack(xs), *[params[f"{prefix}_{i}"] for i in range(n)])}
  stacked = {k: v for k, v in params.items() if not k.startswith(("encoder_", "decoder_"))}
  stacked["encoder_stack"] = stack("encoder", cfg.num_encoder_layers)
  stacked["decoder_stack"] = stack("decoder", cfg.num_decoder_layers)
  fresh = _init(dataclasses.replace(cfg, scan_layers=True), rng)[1]
  assert jax.tree.map(jnp.shape, fresh) == jax.tree.map(jnp.shape, stacked)

  src, tgt = _tokens(1, (2, 7)), _tokens(2, (2, 6))
  np.testing.assert_allclose(scanned.apply({"params": stacked}, src, tgt),
                             model.apply({"params": params}, src, tgt), atol=1e-5)
  search = lambda m, p: decode.generate(p, src, model=m, beam_size=3, alpha=0.6,
                                        max_extra_length=5, eos_id=1)
  np.testing.assert_array_equal(search(scanned, stacked), search(model, params))
