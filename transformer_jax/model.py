"""The encoder-decoder Transformer of Vaswani et al. (2017), Sec. 3, in Flax linen.

Parameters carry logical axis names (`vocab`, `embed`, `heads`, `kv`, `mlp`, `length`)
and activations are constrained at block boundaries with `activation_*` names; a rules
table (see `partitioning.py`) maps both onto a device mesh. Without a mesh the
constraints do nothing.

Token id 0 is padding and doubles as the decoder's start symbol, as in tensor2tensor.
"""

from __future__ import annotations

from typing import Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.config import ModelConfig
from transformer_jax.tokenizer import PAD_ID

# Logical names of activation axes, mapped to mesh axes by the rules table.
BATCH_LENGTH_EMBED = ("activation_batch", "activation_length", "activation_embed")
BATCH_LENGTH_HEADS_KV = ("activation_batch", "activation_length", "activation_heads",
                         "activation_kv")
BATCH_LENGTH_MLP = ("activation_batch", "activation_length", "activation_mlp")
BATCH_LENGTH_VOCAB = ("activation_batch", "activation_length", "activation_vocab")

_glorot = nn.initializers.xavier_uniform


def _param_init(init: Callable, axes: tuple[str, ...]) -> Callable:
  return nn.with_logical_partitioning(init, axes)


def sinusoidal_position_encoding(max_len: int, d_model: int) -> np.ndarray:
  """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(same) (Sec. 3.5)."""
  position = np.arange(max_len, dtype=np.float64)[:, None]
  two_i = np.arange(0, d_model, 2, dtype=np.float64)[None, :]
  angle = position / np.power(10000.0, two_i / d_model)  # [max_len, ceil(d_model / 2)]
  table = np.zeros((max_len, d_model), np.float64)
  table[:, 0::2] = np.sin(angle)
  table[:, 1::2] = np.cos(angle[:, : d_model // 2])
  return table.astype(np.float32)


def train_flops_per_target_token(cfg: ModelConfig, num_params: float,
                                 mean_length: float) -> float:
  """6 N for the matrix products (forward and backward, N counting the shared embedding
  once, as the output projection) plus attention: 12 d n per self- or cross-attention
  block (scores and weighted sum, forward and backward), source and target tokens
  counted as equal."""
  blocks = cfg.num_encoder_layers + 2 * cfg.num_decoder_layers
  return 6.0 * num_params + 12.0 * cfg.d_model * mean_length * blocks


@flax.struct.dataclass
class AttentionMask:
  """Which keys each query may attend to (Sec. 3.2.3), in the two forms attention
  kernels take: a dense boolean [batch, 1, q_len, k_len] array (`dense()`), or, for
  rows without packing, valid-prefix lengths and a causal flag (`seq_lengths()`), which
  cuDNN's fused kernel applies itself, with no bias array.

  Padding keys are never attended; with segment ids (packed rows), a query sees only
  keys of its own sentence; `causal` hides later positions. Padding queries are left as
  they are: the loss ignores their outputs.
  """

  query_valid: jax.Array  # [batch, q_len] bool
  key_valid: jax.Array  # [batch, k_len] bool
  query_segments: jax.Array | None = None  # [batch, q_len] sentence ids of packed rows
  key_segments: jax.Array | None = None
  causal: bool = flax.struct.field(pytree_node=False, default=False)

  @property
  def packed(self) -> bool:
    return self.query_segments is not None

  def dense(self) -> jax.Array:
    mask = self.key_valid[:, None, None, :]
    if self.packed:
      mask = mask & (self.query_segments[:, None, :, None] ==
                     self.key_segments[:, None, None, :])
    if self.causal:  # Only self-attention is causal: queries and keys are the same length.
      length = self.key_valid.shape[-1]
      mask = mask & jnp.tril(jnp.ones((length, length), bool))[None, None]
    return mask

  def seq_lengths(self) -> tuple[jax.Array, jax.Array]:
    """(query lengths, key lengths) [batch] int32: unpacked rows pad only at the end."""
    return (jnp.sum(self.query_valid, axis=-1, dtype=jnp.int32),
            jnp.sum(self.key_valid, axis=-1, dtype=jnp.int32))


def attention_implementation(cfg: ModelConfig) -> str:
  """The attention kernel to use: "cudnn" or "xla". "auto" picks cuDNN's fused kernel on
  a GPU in bfloat16 or float16 where its limits allow (no dropout on attention weights,
  d_k = d_v, head size a multiple of 8 up to 128), else XLA."""
  choice = cfg.attention_implementation
  if choice != "auto":
    return choice or "xla"
  fits = (jax.default_backend() == "gpu" and cfg.dtype in ("bfloat16", "float16")
          and cfg.attention_dropout_rate == 0 and cfg.qk_dim == cfg.head_dim
          and cfg.head_dim % 8 == 0 and cfg.head_dim <= 128)
  return "cudnn" if fits else "xla"


def fused_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: AttentionMask | None,
                    implementation: str) -> jax.Array:
  """softmax(Q K^T / sqrt(d_k)) V (Sec. 3.2.1) through jax.nn.dot_product_attention.

  cuDNN gets the mask as sequence lengths and `is_causal`, which it applies inside the
  kernel; a dense mask would reach it as an additive [batch, 1, q, k] bias (and that
  bias's gradient). Packed rows have no such form in JAX's public API and take XLA.
  """
  if mask is None:
    return jax.nn.dot_product_attention(q, k, v, implementation=implementation)
  if implementation == "cudnn" and not mask.packed:
    query_lengths, key_lengths = mask.seq_lengths()
    return jax.nn.dot_product_attention(
        q, k, v, is_causal=mask.causal, query_seq_lengths=query_lengths,
        key_value_seq_lengths=key_lengths, implementation="cudnn")
  return jax.nn.dot_product_attention(q, k, v, mask=mask.dense(), implementation="xla")


def shift_right(targets: jax.Array, segments: jax.Array | None = None) -> jax.Array:
  """Decoder input: the target shifted right by one, each sentence starting at PAD_ID."""
  shifted = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=PAD_ID)[:, :-1]
  if segments is not None:  # The first token of each packed sentence gets the start id.
    prev = jnp.pad(segments, ((0, 0), (1, 0)))[:, :-1]
    shifted = jnp.where(segments == prev, shifted, PAD_ID)
  return shifted


class MultiHeadAttention(nn.Module):
  """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O (Sec. 3.2.2), no biases."""

  config: ModelConfig

  @nn.compact
  def __call__(self, x_q: jax.Array, x_kv: jax.Array, mask: AttentionMask | None, *,
               deterministic: bool, use_cache: bool = False, cache_len: int = 0,
               static_kv: bool = False, beam_origins: jax.Array | None = None
               ) -> jax.Array:
    """Decoding (`use_cache`) keeps a cache: self-attention appends each step's key and
    value to it (`cache_len` positions, allocated by the first, cache-building call);
    with `static_kv` (cross-attention: x_kv is the encoder output, the same at every
    step) the keys and values are projected once, by that first call, and then read.
    While decoding, x_kv may hold one row per sentence and x_q several consecutive
    rows per sentence (its beams), which then share that sentence's keys and values.
    In beam search, each beam writes its own row of the self-attention cache and
    `beam_origins` [sentences, beams, positions] names, for each beam and position, the
    beam row of its sentence that holds that position of its history (parent pointers:
    no cache is reordered when beams are reselected).
    """
    cfg = self.config
    dtype = jnp.dtype(cfg.dtype)
    # Glorot over the [d_model, heads * head_dim] matrix each kernel really is.
    w_init = nn.initializers.variance_scaling(1.0, "fan_avg", "uniform", in_axis=0,
                                              out_axis=(1, 2))
    kernel = lambda name, size: self.param(
        name, _param_init(w_init, ("embed", "heads", "kv")),
        (cfg.d_model, cfg.num_heads, size)).astype(dtype)
    q = jnp.einsum("bld,dhk->blhk", x_q.astype(dtype), kernel("query", cfg.qk_dim))
    q = nn.with_logical_constraint(q, BATCH_LENGTH_HEADS_KV)
    key_kernel, value_kernel = kernel("key", cfg.qk_dim), kernel("value", cfg.head_dim)
    def project_kv():  # k: [batch, length, heads, d_k]; v: [batch, length, heads, d_v]
      k = jnp.einsum("bld,dhk->blhk", x_kv.astype(dtype), key_kernel)
      v = jnp.einsum("bld,dhk->blhk", x_kv.astype(dtype), value_kernel)
      return (nn.with_logical_constraint(t, BATCH_LENGTH_HEADS_KV) for t in (k, v))
    if use_cache and static_kv:
      if self.has_variable("cache", "static_key"):
        k, v = self.get_variable("cache", "static_key"), self.get_variable("cache", "static_value")
      else:
        k, v = (_heads_first(t) for t in project_kv())
        self.put_variable("cache", "static_key", k)
        self.put_variable("cache", "static_value", v)
      key_valid = None if mask is None else mask.key_valid[:, None, None, :]
      out = _attend_cached(q, k, v, key_valid)
    elif use_cache:
      out = _attend_cached(q, *self._extend_cache(*project_kv(), cache_len), beam_origins)
    elif (cfg.attention_dropout_rate > 0 and not deterministic) or cfg.qk_dim != cfg.head_dim:
      # jax.nn.dot_product_attention has no dropout on the attention weights and needs
      # d_k = d_v, so these two options are spelled out; all else uses the fused call.
      k, v = project_kv()
      logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(cfg.qk_dim).astype(dtype)
      if mask is not None:
        logits = jnp.where(mask.dense(), logits, jnp.finfo(logits.dtype).min)
      weights = jax.nn.softmax(logits.astype(jnp.float32)).astype(dtype)
      weights = nn.Dropout(cfg.attention_dropout_rate)(weights, deterministic=False)
      out = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
    else:
      k, v = project_kv()
      out = fused_attention(q, k, v, mask, attention_implementation(cfg))
    out = nn.with_logical_constraint(out, BATCH_LENGTH_HEADS_KV)
    o_init = nn.initializers.variance_scaling(1.0, "fan_avg", "uniform", in_axis=(0, 1),
                                              out_axis=2)
    w_o = self.param("out", _param_init(o_init, ("heads", "kv", "embed")),
                     (cfg.num_heads, cfg.head_dim, cfg.d_model)).astype(dtype)
    out = jnp.einsum("blhk,hkd->bld", out, w_o)  # Concat(heads) W^O.
    return nn.with_logical_constraint(out, BATCH_LENGTH_EMBED)

  def _extend_cache(self, k, v, cache_len):
    """Autoregressive decoding: appends this step's key/value to the cache and returns
    (keys, values, mask) to attend to, in the cache's [batch, heads, length, d] layout.

    The first call creates an empty cache of `cache_len` positions (and writes
    nothing); each later call passes one position and attends to all written so far.
    """
    k, v = _heads_first(k), _heads_first(v)
    initialized = self.has_variable("cache", "cached_key")
    shape = lambda x: (x.shape[0], x.shape[1], cache_len, x.shape[3])
    cached_k = self.variable("cache", "cached_key", jnp.zeros, shape(k), k.dtype)
    cached_v = self.variable("cache", "cached_value", jnp.zeros, shape(v), v.dtype)
    index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
    if not initialized:
      return k, v, None
    i = index.value
    cached_k.value = jax.lax.dynamic_update_slice(cached_k.value, k, (0, 0, i, 0))
    cached_v.value = jax.lax.dynamic_update_slice(cached_v.value, v, (0, 0, i, 0))
    index.value = i + 1
    positions = jnp.arange(cached_k.value.shape[2])
    mask = (positions <= i)[None, None, None, :]  # [1, 1, 1, cache length]
    return cached_k.value, cached_v.value, mask


# Decoding caches keep heads before length: [batch, heads, length, d]. Each step's
# attention is then a batch of [queries, d] x [d, length] products over (batch, heads)
# with no transposes, several times faster on CPUs than the [batch, length, heads, d]
# layout of training.
BATCH_HEADS_LENGTH_KV = ("activation_batch", "activation_heads", "activation_length",
                         "activation_kv")


def _heads_first(x: jax.Array) -> jax.Array:
  """[batch, length, heads, d] -> [batch, heads, length, d]."""
  return nn.with_logical_constraint(x.transpose(0, 2, 1, 3), BATCH_HEADS_LENGTH_KV)


def _attend_cached(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None,
                   origins: jax.Array | None = None) -> jax.Array:
  """Attention of one decoding step: q [rows, 1, heads, d_k] against cached k [batch,
  heads, length, d_k] and v [batch, heads, length, d_v], where rows = batch x n (n
  consecutive rows, the beams of a sentence, share its keys and values); mask
  broadcasts to [batch, 1, 1, length]. With `origins` (see MultiHeadAttention), the
  cache has a row per beam instead, read through the origins. Returns [rows, 1, heads,
  d_v]."""
  if origins is not None:
    return _attend_through_origins(q, k, v, mask, origins)
  rows, _, heads, d_k = q.shape
  q = q.reshape(k.shape[0], rows // k.shape[0], heads, d_k)  # [batch, n, heads, d_k]
  logits = jnp.einsum("bnhd,bhkd->bhnk", q, k) / np.sqrt(d_k).astype(q.dtype)
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
  weights = jax.nn.softmax(logits.astype(jnp.float32)).astype(v.dtype)
  out = jnp.einsum("bhnk,bhkd->bnhd", weights, v)
  return out.reshape(rows, 1, heads, v.shape[-1])


def _attend_through_origins(q: jax.Array, k: jax.Array, v: jax.Array,
                            mask: jax.Array, origins: jax.Array) -> jax.Array:
  """q [batch x beams, 1, heads, d_k] against a cache with a row per beam, k [batch x
  beams, heads, length, d_k] (v likewise), where beam n's position t is in beam row
  origins[b, n, t] of its sentence. Each query scores the keys of all its sentence's
  beam rows and keeps, per position, its origin's: beams times the attention products
  of a reordered cache, and no copy of the cache."""
  batch, beams = origins.shape[:2]
  rows, heads, length, d_k = k.shape
  q = q.reshape(batch, beams, heads, d_k)
  k = k.reshape(batch, beams, heads, length, d_k)
  v = v.reshape(batch, beams, heads, length, v.shape[-1])
  select = jax.nn.one_hot(origins[..., :length], beams, dtype=q.dtype)  # [b, n, t, c]
  scores = jnp.einsum("bnhd,bchtd->bnhct", q, k) / np.sqrt(d_k).astype(q.dtype)
  logits = jnp.einsum("bnhct,bntc->bnht", scores, select)
  logits = jnp.where(mask[0, 0], logits, jnp.finfo(logits.dtype).min)  # [1, t] mask
  weights = jax.nn.softmax(logits.astype(jnp.float32)).astype(v.dtype)
  out = jnp.einsum("bnht,bntc,bchtd->bnhd", weights, select, v)
  return out.reshape(rows, 1, heads, v.shape[-1])


class FeedForward(nn.Module):
  """FFN(x) = max(0, x W1 + b1) W2 + b2 (Sec. 3.3)."""

  config: ModelConfig

  @nn.compact
  def __call__(self, x: jax.Array, *, deterministic: bool) -> jax.Array:
    cfg = self.config
    dtype = jnp.dtype(cfg.dtype)
    h = nn.Dense(cfg.d_ff, dtype=dtype, name="wi",
                 kernel_init=_param_init(_glorot(), ("embed", "mlp")),
                 bias_init=_param_init(nn.initializers.zeros, ("mlp",)))(x)
    h = nn.with_logical_constraint(nn.relu(h), BATCH_LENGTH_MLP)
    h = nn.Dropout(cfg.relu_dropout_rate)(h, deterministic=deterministic)
    return nn.Dense(cfg.d_model, dtype=dtype, name="wo",
                    kernel_init=_param_init(_glorot(), ("mlp", "embed")),
                    bias_init=_param_init(nn.initializers.zeros, ("embed",)))(h)


def _layer_norm(cfg: ModelConfig, name: str) -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=1e-6, dtype=jnp.dtype(cfg.dtype), name=name,
                      scale_init=_param_init(nn.initializers.ones, ("embed",)),
                      bias_init=_param_init(nn.initializers.zeros, ("embed",)))


def _residual(cfg: ModelConfig, sublayer: Callable, x: jax.Array, norm_name: str,
              deterministic: bool) -> jax.Array:
  """Paper: LayerNorm(x + Dropout(Sublayer(x))) (Sec. 3.1, 5.4); option: pre-norm."""
  norm = _layer_norm(cfg, norm_name)
  drop = nn.Dropout(cfg.dropout_rate)
  if cfg.pre_norm:
    return x + drop(sublayer(norm(x)), deterministic=deterministic)
  return norm(x + drop(sublayer(x), deterministic=deterministic))


class EncoderLayer(nn.Module):
  config: ModelConfig

  @nn.compact
  def __call__(self, x, mask, *, deterministic: bool):
    cfg = self.config
    attend = MultiHeadAttention(cfg, name="self_attention")
    x = _residual(cfg, lambda y: attend(y, y, mask, deterministic=deterministic), x,
                  "self_attention_norm", deterministic)
    ffn = FeedForward(cfg, name="ffn")
    x = _residual(cfg, lambda y: ffn(y, deterministic=deterministic), x, "ffn_norm",
                  deterministic)
    return nn.with_logical_constraint(x, BATCH_LENGTH_EMBED)


class DecoderLayer(nn.Module):
  config: ModelConfig

  @nn.compact
  def __call__(self, y, encoded, self_mask, cross_mask, *, deterministic: bool,
               use_cache: bool, cache_len: int = 0, beam_origins=None):
    cfg = self.config
    self_attend = MultiHeadAttention(cfg, name="self_attention")
    y = _residual(cfg, lambda z: self_attend(z, z, self_mask, deterministic=deterministic,
                                             use_cache=use_cache, cache_len=cache_len,
                                             beam_origins=beam_origins),
                  y, "self_attention_norm", deterministic)
    cross_attend = MultiHeadAttention(cfg, name="cross_attention")
    y = _residual(cfg, lambda z: cross_attend(z, encoded, cross_mask,
                                              deterministic=deterministic, use_cache=use_cache,
                                              static_kv=True),
                  y, "cross_attention_norm", deterministic)
    ffn = FeedForward(cfg, name="ffn")
    y = _residual(cfg, lambda z: ffn(z, deterministic=deterministic), y, "ffn_norm",
                  deterministic)
    return nn.with_logical_constraint(y, BATCH_LENGTH_EMBED)


class _ScanEncoderStep(nn.Module):
  """An encoder layer as one step of nn.scan: (x, mask, deterministic) -> (x, None)."""

  config: ModelConfig

  @nn.compact
  def __call__(self, x, mask, deterministic):
    return EncoderLayer(self.config, name="layer")(x, mask, deterministic=deterministic), None


class _ScanDecoderStep(nn.Module):
  """A decoder layer as one step of nn.scan."""

  config: ModelConfig

  @nn.compact
  def __call__(self, y, encoded, self_mask, cross_mask, deterministic, use_cache, cache_len,
               beam_origins):
    return DecoderLayer(self.config, name="layer")(
        y, encoded, self_mask, cross_mask, deterministic=deterministic, use_cache=use_cache,
        cache_len=cache_len, beam_origins=beam_origins), None


def _layer_stack(step: type[nn.Module], cfg: ModelConfig, length: int, broadcast: int,
                 name: str) -> nn.Module:
  """`length` layers as one scanned layer: parameters (and decoding caches) stacked on
  a leading "layers" axis, compiled once whatever the depth."""
  return nn.scan(step, variable_axes={"params": 0, "cache": 0},
                 split_rngs={"params": True, "dropout": True},
                 in_axes=(nn.broadcast,) * broadcast, length=length,
                 metadata_params={nn.PARTITION_NAME: "layers"})(cfg, name=name)


class Embedder(nn.Module):
  """Token embedding times sqrt(d_model) (Sec. 3.4) plus position encoding (Sec. 3.5)."""

  config: ModelConfig
  token_embed: nn.Embed

  @nn.compact
  def __call__(self, tokens: jax.Array, positions: jax.Array, *,
               deterministic: bool) -> jax.Array:
    cfg = self.config
    x = self.token_embed(tokens) * jnp.asarray(np.sqrt(cfg.d_model), jnp.dtype(cfg.dtype))
    if cfg.learned_positions:
      table = self.param("position_embedding",
                         _param_init(nn.initializers.normal(np.sqrt(0.5)),
                                     ("length", "embed")),
                         (cfg.max_len, cfg.d_model))  # Same RMS as the sinusoids.
    else:
      table = jnp.asarray(sinusoidal_position_encoding(cfg.max_len, cfg.d_model))
    x = x + jnp.take(table, positions, axis=0).astype(x.dtype)
    x = nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)  # Sec. 5.4.
    return nn.with_logical_constraint(x, BATCH_LENGTH_EMBED)


def _default_positions(tokens: jax.Array) -> jax.Array:
  return jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)


class Transformer(nn.Module):
  """Encoder-decoder Transformer. `__call__` returns logits [batch, len, vocab] in the
  compute dtype (`project=False`: the decoder's states, for a chunked loss).

  Packed rows pass `*_segmentation` (sentence ids, 0 for padding) and `*_positions`
  (position within each sentence).
  """

  config: ModelConfig

  def setup(self):
    cfg = self.config
    embed = lambda name: nn.Embed(
        cfg.padded_vocab_size, cfg.d_model, dtype=jnp.dtype(cfg.dtype), name=name,
        # Unit-variance embeddings after the sqrt(d_model) scaling.
        embedding_init=_param_init(nn.initializers.normal(cfg.d_model**-0.5),
                                   ("vocab", "embed")))
    if cfg.share_embeddings:
      self.source_embed = self.target_embed = embed("embed")
    else:
      self.source_embed, self.target_embed = embed("source_embed"), embed("target_embed")
      self.output_projection = nn.Dense(
          cfg.padded_vocab_size, use_bias=False, dtype=jnp.dtype(cfg.dtype), name="logits",
          kernel_init=_param_init(_glorot(), ("embed", "vocab")))
    self.source_embedder = Embedder(cfg, self.source_embed, name="source_embedder")
    self.target_embedder = Embedder(cfg, self.target_embed, name="target_embedder")
    if cfg.scan_layers:
      self.encoder_stack = _layer_stack(_ScanEncoderStep, cfg, cfg.num_encoder_layers, 2,
                                        "encoder_stack")
      self.decoder_stack = _layer_stack(_ScanDecoderStep, cfg, cfg.num_decoder_layers, 7,
                                        "decoder_stack")
    else:
      self.encoder_layers = [EncoderLayer(cfg, name=f"encoder_{i}")
                             for i in range(cfg.num_encoder_layers)]
      self.decoder_layers = [DecoderLayer(cfg, name=f"decoder_{i}")
                             for i in range(cfg.num_decoder_layers)]
    if cfg.pre_norm:  # Pre-norm stacks end with a LayerNorm.
      self.encoder_norm = _layer_norm(cfg, "encoder_norm")
      self.decoder_norm = _layer_norm(cfg, "decoder_norm")

  def encode(self, inputs: jax.Array, inputs_positions: jax.Array | None = None,
             inputs_segmentation: jax.Array | None = None, *,
             deterministic: bool = True) -> jax.Array:
    """inputs [batch, src_len] -> encoder output [batch, src_len, d_model]."""
    if inputs_positions is None:
      inputs_positions = _default_positions(inputs)
    valid = inputs != PAD_ID
    mask = AttentionMask(valid, valid, inputs_segmentation, inputs_segmentation)
    x = self.source_embedder(inputs, inputs_positions, deterministic=deterministic)
    if self.config.scan_layers:
      x, _ = self.encoder_stack(x, mask, deterministic)
    else:
      for layer in self.encoder_layers:
        x = layer(x, mask, deterministic=deterministic)
    return self.encoder_norm(x) if self.config.pre_norm else x

  def decode(self, encoded: jax.Array, inputs: jax.Array, targets: jax.Array,
             targets_positions: jax.Array | None = None,
             inputs_segmentation: jax.Array | None = None,
             targets_segmentation: jax.Array | None = None, *,
             deterministic: bool = True, use_cache: bool = False,
             cache_len: int = 0, project: bool = True,
             beam_origins: jax.Array | None = None) -> jax.Array:
    """Logits [batch, tgt_len, vocab] for `targets`, in the compute dtype (model.dtype);
    with `project=False`, the decoder's output states [batch, tgt_len, d_model].

    Training: `targets` is the whole target; the decoder reads it shifted right.
    Decoding (`use_cache=True`): `targets` is the previous token [batch, 1] and
    `targets_positions` its position; keys and values come from the cache, which the
    first call builds (`cache_len` positions; the encoder output's keys and values
    for cross-attention, projected once); beam search passes `beam_origins` (see
    MultiHeadAttention).
    """
    if use_cache:
      decoder_inputs, self_mask = targets, None  # The cache supplies the causal mask.
      cross_mask = AttentionMask(targets != PAD_ID, inputs != PAD_ID)
    else:
      decoder_inputs = shift_right(targets, targets_segmentation)
      target_valid = targets != PAD_ID
      self_mask = AttentionMask(target_valid, target_valid, targets_segmentation,
                                targets_segmentation, causal=True)
      cross_mask = AttentionMask(target_valid, inputs != PAD_ID, targets_segmentation,
                                 inputs_segmentation)
    if targets_positions is None:
      targets_positions = _default_positions(decoder_inputs)
    y = self.target_embedder(decoder_inputs, targets_positions, deterministic=deterministic)
    if self.config.scan_layers:
      y, _ = self.decoder_stack(y, encoded, self_mask, cross_mask, deterministic, use_cache,
                                cache_len, beam_origins)
    else:
      for layer in self.decoder_layers:
        y = layer(y, encoded, self_mask, cross_mask, deterministic=deterministic,
                  use_cache=use_cache, cache_len=cache_len, beam_origins=beam_origins)
    if self.config.pre_norm:
      y = self.decoder_norm(y)
    return self.project(y) if project else y

  def project(self, y: jax.Array) -> jax.Array:
    """Decoder states [..., d_model] -> logits [..., vocab] in the compute dtype."""
    if self.config.share_embeddings:
      logits = self.target_embed.attend(y)  # Pre-softmax projection = embedding^T.
    else:
      logits = self.output_projection(y)
    logits = logits[..., :self.config.vocab_size]  # Padded ids (vocab_multiple) never win.
    return nn.with_logical_constraint(logits, BATCH_LENGTH_VOCAB)

  def __call__(self, inputs: jax.Array, targets: jax.Array,
               inputs_positions: jax.Array | None = None,
               targets_positions: jax.Array | None = None,
               inputs_segmentation: jax.Array | None = None,
               targets_segmentation: jax.Array | None = None, *,
               deterministic: bool = True, project: bool = True) -> jax.Array:
    encoded = self.encode(inputs, inputs_positions, inputs_segmentation,
                          deterministic=deterministic)
    return self.decode(encoded, inputs, targets, targets_positions, inputs_segmentation,
                       targets_segmentation, deterministic=deterministic, project=project)
