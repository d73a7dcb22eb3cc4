"""The model against the paper (Vaswani et al. 2017, Sec. 3)."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import stacked_layers
from transformer_jax.config import ModelConfig
from transformer_jax.data.tokenizer import PAD_ID
from transformer_jax.model import attention as attention_lib
from transformer_jax.model.attention import AttentionMask, MultiHeadAttention
from transformer_jax.model.transformer import EncoderLayer, FeedForward, relu
from transformer_jax.model.transformer import relu_from_output, shift_right
from transformer_jax.model.transformer import sinusoidal_position_encoding, Transformer


def _init(cfg, rng, src_len=7, tgt_len=6):
  model = Transformer(cfg)
  ones = lambda n: jnp.ones((2, n), jnp.int32)
  return model, nn.meta.unbox(model.init(rng, ones(src_len), ones(tgt_len))["params"])


def _tokens(seed, shape, vocab=37):
  return jax.random.randint(jax.random.key(seed), shape, 3, vocab)


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


def test_qkv_init_scale_scales_the_query_key_and_value_variances_only(rng):
  """Glorot-uniform projections (variance 2 / (fan_in + fan_out) = 1 / d_model here);
  model.qkv_init_scale=0.5 is fairseq's gain of 1/sqrt(2) on q, k and v."""
  cfg = ModelConfig(vocab_size=40, d_model=128, num_heads=4, d_ff=256, num_encoder_layers=1,
                    num_decoder_layers=1)
  for scale in (1.0, 0.5):
    _, params = _init(dataclasses.replace(cfg, qkv_init_scale=scale), rng)
    attention = params["encoder_0"]["self_attention"]
    for name in ("query", "key", "value"):
      assert np.var(attention[name]) == pytest.approx(scale / 128, rel=0.05), (scale, name)
    assert np.var(attention["out"]) == pytest.approx(1 / 128, rel=0.05)


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


# Every registered attention implementation that runs here in float32 ('cudnn' needs a
# GPU and bfloat16: tests/benchmarks/test_gpu_lowering.py lowers it for CUDA).
RUN_HERE = [name for name, choice in attention_lib.implementations().items()
            if jax.default_backend() in choice.platforms and "float32" in choice.dtypes]


@pytest.mark.parametrize("option", [{}, *({"attention_implementation": name}
                                          for name in RUN_HERE), {"key_dim": 4}],
                         ids=["default", *RUN_HERE, "key_dim"])
def test_attention_is_scaled_dot_product_attention_over_heads(tiny_model_config, rng,
                                                              option):
  """Sec. 3.2.1-3.2.2: Concat(softmax(Q K^T / sqrt(d_k)) V per head) W^O, padded keys
  weighted 0, against numpy: the default implementation and each registered one that
  runs here, and the spelled-out path that d_k != d_v takes."""
  cfg = dataclasses.replace(tiny_model_config, **option)
  attention = MultiHeadAttention(cfg)
  x_q, x_kv = (np.asarray(jax.random.normal(jax.random.key(i), (2, n, cfg.d_model)))
               for i, n in ((1, 5), (2, 7)))
  key_valid = np.arange(7) < np.array([[7], [4]])  # The second row has 3 padded keys.
  mask = AttentionMask(jnp.ones((2, 5), bool), jnp.asarray(key_valid))
  params = nn.meta.unbox(attention.init(rng, x_q, x_kv, mask, deterministic=True)["params"])
  got = attention.apply({"params": params}, x_q, x_kv, mask, deterministic=True)

  w = jax.tree.map(np.asarray, params)
  q, k, v = (np.einsum("bld,dhk->bhlk", x, w[name])
             for x, name in ((x_q, "query"), (x_kv, "key"), (x_kv, "value")))
  logits = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
  logits = np.where(key_valid[:, None, None, :], logits, -np.inf)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  expected = np.einsum("bhqv,hvd->bqd", weights @ v, w["out"])
  np.testing.assert_allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize("pre_norm", [False, True])
def test_residual_sublayers_normalize_after_by_default_and_before_as_an_option(
    tiny_model_config, rng, pre_norm):
  """Sec. 3.1: an encoder layer is y = LayerNorm(x + Attention(x)), then
  LayerNorm(y + FFN(y)); option model.pre_norm: y = x + Attention(LayerNorm(x)), then
  y + FFN(LayerNorm(y)). Checked by composing the layer's own sublayers."""
  cfg = dataclasses.replace(tiny_model_config, dropout_rate=0.0, pre_norm=pre_norm)
  layer = EncoderLayer(cfg)
  x = jax.random.normal(jax.random.key(1), (2, 5, cfg.d_model))
  params = nn.meta.unbox(layer.init(rng, x, None, deterministic=True)["params"])
  for name in ("self_attention_norm", "ffn_norm"):  # Not the identity, so order matters.
    params[name] = {"scale": 1 + jax.random.normal(jax.random.key(len(name)), (cfg.d_model,)),
                    "bias": jax.random.normal(jax.random.key(7), (cfg.d_model,))}
  got = layer.apply({"params": params}, x, None, deterministic=True)

  norm = lambda name, y: nn.LayerNorm(epsilon=1e-6).apply({"params": params[name]}, y)
  attend = lambda y: MultiHeadAttention(cfg).apply(
      {"params": params["self_attention"]}, y, y, None, deterministic=True)
  ffn = lambda y: FeedForward(cfg).apply({"params": params["ffn"]}, y, deterministic=True)
  if pre_norm:
    y = x + attend(norm("self_attention_norm", x))
    expected = y + ffn(norm("ffn_norm", y))
  else:
    y = norm("self_attention_norm", x + attend(x))
    expected = norm("ffn_norm", y + ffn(y))
  np.testing.assert_allclose(got, expected, atol=1e-5)


def test_pre_norm_stacks_end_with_a_layer_norm(tiny_model_config, rng):
  _, params = _init(dataclasses.replace(tiny_model_config, pre_norm=True), rng)
  assert "encoder_norm" in params and "decoder_norm" in params
  _, paper = _init(tiny_model_config, rng)
  assert "encoder_norm" not in paper and "decoder_norm" not in paper


def test_learned_positions_replace_the_sinusoids(tiny_model_config, rng):
  """Option model.learned_positions (Table 3 (E)): set to the sinusoid table, the learned
  embeddings give the paper's outputs exactly; another table changes them."""
  cfg = dataclasses.replace(tiny_model_config, dropout_rate=0.0)
  model, params = _init(cfg, rng)
  learned, learned_params = _init(dataclasses.replace(cfg, learned_positions=True), rng)
  table = sinusoidal_position_encoding(cfg.max_len, cfg.d_model)
  as_sinusoids = {**params, **{side: {**params.get(side, {}), "position_embedding": table}
                               for side in ("source_embedder", "target_embedder")}}
  assert jax.tree.map(jnp.shape, as_sinusoids) == jax.tree.map(jnp.shape, learned_params)
  src, tgt = _tokens(1, (2, 7)), _tokens(2, (2, 6))
  paper_out = model.apply({"params": params}, src, tgt)
  np.testing.assert_allclose(learned.apply({"params": as_sinusoids}, src, tgt), paper_out,
                             atol=1e-6)
  assert not np.allclose(learned.apply({"params": learned_params}, src, tgt), paper_out,
                         atol=1e-3)


def test_bfloat16_compute_keeps_float32_parameters_and_bfloat16_logits(tiny_model_config,
                                                                       rng):
  """Mixed precision: parameters stay float32; the logits come out in the compute dtype
  (the loss widens them to float32 inside its reductions, losses.token_metrics)."""
  cfg = dataclasses.replace(tiny_model_config, dtype="bfloat16")
  model, params = _init(cfg, rng)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
  src, tgt = _tokens(1, (2, 7)), _tokens(2, (2, 6))
  low = model.apply({"params": params}, src, tgt)
  full = Transformer(tiny_model_config).apply({"params": params}, src, tgt)
  assert low.dtype == jnp.bfloat16 and full.dtype == jnp.float32
  low = np.asarray(low.astype(jnp.float32))
  np.testing.assert_allclose(low, full, atol=0.15)
  assert not np.array_equal(low, full)  # bfloat16 really was used.


def test_the_embedding_gradient_sums_in_float32_under_bfloat16(tiny_model_config, rng):
  """The lookup's gradient adds one update per occurrence of a token into its row. With
  bfloat16 compute those sums must still be float32: 1,000 occurrences of one token, each
  adding sqrt(d_model), sum to exactly 1,000 sqrt(d_model). Summed in bfloat16 (8 bits
  of mantissa) the row stops growing long before, and on a GPU the bfloat16 scatter was
  a quarter of base's step (docs/results.md)."""
  cfg = dataclasses.replace(tiny_model_config, dtype="bfloat16", dropout_rate=0.0)
  model, params = _init(cfg, rng)
  tokens = jnp.full((4, 250), 5, jnp.int32)
  positions = jnp.zeros_like(tokens)  # No position is needed; they add no gradient.

  def embedded_sum(params):
    x = model.apply({"params": params}, tokens, positions, deterministic=True,
                    method=lambda m, *a, **k: m.source_embedder(*a, **k))
    return jnp.sum(x.astype(jnp.float32))

  grad = jax.grad(embedded_sum)(params)["embed"]["embedding"]
  assert grad.dtype == jnp.float32
  each = float(jnp.asarray(np.sqrt(cfg.d_model), jnp.bfloat16))
  np.testing.assert_allclose(grad[5], np.full(cfg.d_model, 1000 * each), rtol=1e-6)
  assert not np.any(np.delete(np.asarray(grad), 5, axis=0))


@pytest.mark.parametrize("pre_norm", [False, True])
def test_layer_norm_epsilon_reaches_every_layer_norm(tiny_model_config, rng, pre_norm):
  """model.layer_norm_epsilon (the paper's code: 1e-6; MarianMT's 1e-5) is the epsilon
  of every LayerNorm the model runs: two a layer in the encoder, three in the decoder,
  and with pre_norm the one ending each stack; and only those normalize."""
  cfg = dataclasses.replace(tiny_model_config, layer_norm_epsilon=3e-3, pre_norm=pre_norm)
  model, params = _init(cfg, rng)
  seen = []

  def record(call, args, kwargs, context):
    if isinstance(context.module, nn.LayerNorm) and context.method_name == "__call__":
      seen.append(context.module.epsilon)
    return call(*args, **kwargs)

  with nn.intercept_methods(record):
    model.apply({"params": params}, _tokens(1, (2, 7)), _tokens(2, (2, 6)))
  expected = (2 * cfg.num_encoder_layers + 3 * cfg.num_decoder_layers + 2 * pre_norm)
  assert seen == [3e-3] * expected


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_looked_up_embedding_rows_are_the_tables_rows_in_the_compute_dtype(
    tiny_model_config, rng, dtype):
  """The lookup reads rows of the float32 table and hands them on in the compute dtype
  (model.dtype), rounded once: the embedder's output is in that dtype, and its value is
  those rows times sqrt(d_model) plus the sinusoids, each in that dtype (Sec. 3.4-3.5)."""
  cfg = dataclasses.replace(tiny_model_config, dtype=dtype, dropout_rate=0.0)
  model, params = _init(cfg, rng)
  table = params["embed"]["embedding"]
  assert table.dtype == jnp.float32
  tokens = _tokens(3, (2, 7))
  positions = jnp.broadcast_to(jnp.arange(7), tokens.shape)
  x = model.apply({"params": params}, tokens, positions, deterministic=True,
                  method=lambda m, *a, **k: m.source_embedder(*a, **k))
  compute = jnp.dtype(dtype)
  assert x.dtype == compute
  rows = jnp.take(table, tokens, axis=0).astype(compute)
  expected = rows * jnp.asarray(np.sqrt(cfg.d_model), compute) + jnp.asarray(
      sinusoidal_position_encoding(cfg.max_len, cfg.d_model))[positions].astype(compute)
  np.testing.assert_array_equal(np.asarray(x, np.float32), np.asarray(expected, np.float32))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("function", [relu, relu_from_output])
def test_the_feed_forward_relu_is_max_zero_with_jaxs_gradient(function, dtype):
  """Sec. 3.3's max(0, x) and its gradient, exactly jax.nn.relu's (0 at 0, either sign),
  both where it is jax.nn.relu and where (a GPU) the gradient comes from the output."""
  x = jnp.concatenate([jnp.array([-3.0, -1e-30, -0.0, 0.0, 1e-30, 2.0]),
                       jax.random.normal(jax.random.key(0), (1000,))]).astype(dtype)
  g = jax.random.normal(jax.random.key(1), x.shape).astype(dtype)
  y, backward = jax.vjp(jax.jit(function), x)
  expected, expected_backward = jax.vjp(jax.nn.relu, x)
  assert y.dtype == dtype
  np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(expected, np.float32))
  (grad,), (expected_grad,) = backward(g), expected_backward(g)
  np.testing.assert_array_equal(np.asarray(grad, np.float32),
                                np.asarray(expected_grad, np.float32))
  assert np.all(np.asarray(grad[:4], np.float32) == 0) and grad[5] == g[5]


def test_the_relus_gradient_reads_its_output_not_its_input():
  """The backward pass compares the saved output, behind an optimization barrier, so XLA
  cannot rewrite max(x, 0) > 0 as x > 0: the product's pre-activation then has one use,
  and a GPU's cuBLASLt applies the bias and the ReLU in the product's epilogue (base's
  floor 0.8 ms lower a step, docs/results.md)."""
  jaxpr = jax.make_jaxpr(jax.grad(lambda x: jnp.sum(relu_from_output(x))))(jnp.ones(8))
  made_by = {v: e.primitive.name for e in jaxpr.jaxpr.eqns for v in e.outvars}
  compares = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "gt"]
  assert compares and all(made_by.get(e.invars[0]) == "optimization_barrier"
                          for e in compares)


def test_the_relu_reads_its_output_only_where_lowered_for_a_gpu():
  """On a TPU (and the CPU) the barrier would keep the output and the pre-activation
  both alive for the backward pass; there the model's ReLU is jax.nn.relu."""
  def lowered(platform):
    grad = jax.grad(lambda x, w: jnp.sum(relu(x @ w) ** 2))
    return jax.jit(grad).trace(jnp.ones((8, 16)), jnp.ones((16, 32))).lower(
        lowering_platforms=(platform,)).as_text()
  assert "optimization_barrier" in lowered("cuda")
  assert "optimization_barrier" not in lowered("tpu")
  assert "optimization_barrier" not in lowered("cpu")


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
  from transformer_jax.model import beam_search
  encoded = model.apply({"params": params}, src, method=Transformer.encode)
  cache = beam_search.init_cache(model, params, encoded, src, 6)
  step, _ = beam_search.transformer_decoder(model, params, encoded, src).step(
      jnp.zeros((2, 1), jnp.int32), cache, jnp.array(0))
  np.testing.assert_allclose(step, out[:, 0], atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("unroll", [1, 64])
def test_scanned_layers_equal_the_unrolled_stack(tiny_model_config, rng, unroll):
  """Option model.scan_layers: the same parameters, stacked on a leading layers axis,
  give the same logits and the same beam search, a layer a trip or (model.scan_unroll
  above the depth) all of them in one."""
  from transformer_jax.model import beam_search
  cfg = dataclasses.replace(tiny_model_config, dropout_rate=0.0)
  model, params = _init(cfg, rng)
  scanned = Transformer(dataclasses.replace(cfg, scan_layers=True, scan_unroll=unroll))
  stacked = stacked_layers(params, cfg.num_encoder_layers, cfg.num_decoder_layers)
  fresh = _init(dataclasses.replace(cfg, scan_layers=True), rng)[1]
  assert jax.tree.map(jnp.shape, fresh) == jax.tree.map(jnp.shape, stacked)

  src, tgt = _tokens(1, (2, 7)), _tokens(2, (2, 6))
  np.testing.assert_allclose(scanned.apply({"params": stacked}, src, tgt),
                             model.apply({"params": params}, src, tgt), atol=1e-5)
  generate = lambda m, p: beam_search.generate(p, src, model=m, beam_size=3, alpha=0.6,
                                               max_extra_length=5, eos_id=1)
  np.testing.assert_array_equal(generate(scanned, stacked), generate(model, params))


@pytest.mark.parametrize("unroll, loops", [(1, True), (3, False)])
def test_scan_unroll_at_the_depth_leaves_no_loop_and_keeps_the_parameters_stacked(
    tiny_model_config, rng, unroll, loops):
  """model.scan_unroll: below the depth the layers run in a loop; at or above it the
  program is straight-line, with the parameters still stacked [depth, ...]."""
  cfg = dataclasses.replace(tiny_model_config, num_encoder_layers=3, num_decoder_layers=3,
                            scan_layers=True, scan_unroll=unroll)
  model, params = _init(cfg, rng)
  assert jax.tree.leaves(params["encoder_stack"])[0].shape[0] == 3
  src, tgt = _tokens(1, (2, 7)), _tokens(2, (2, 6))
  loss = lambda p: jnp.sum(model.apply({"params": p}, src, tgt))
  text = jax.jit(jax.grad(loss)).lower(params).compile().as_text()
  # The layers' loop carries their stacked [depth, ...] tensors; another loop (the
  # embedding gradient's scatter-add, which XLA's older CPU emitters write as one)
  # does not.
  layer_loops = [line for line in text.splitlines() if " while(" in line
                 and f"[{cfg.num_encoder_layers}," in line.split(" while(")[0]]
  assert bool(layer_loops) == loops, layer_loops
