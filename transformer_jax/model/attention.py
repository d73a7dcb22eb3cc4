"""Multi-head attention (Sec. 3.2) for training and for cached decoding, the masks it
takes (dense boolean arrays for XLA, sequence lengths and a causal flag for cuDNN's
fused kernel), which implementation computes it (model.attention_implementation, one
module each in attention_implementations/), and the two things a search may do to the
decoding cache.
"""

from __future__ import annotations

from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.config import ATTENTION, ModelConfig

# Logical names of activation axes, mapped to mesh axes by the rules table.
BATCH_LENGTH_EMBED = ("activation_batch", "activation_length", "activation_embed")
BATCH_LENGTH_HEADS_KV = ("activation_batch", "activation_length", "activation_heads",
                         "activation_kv")


def param_init(init: Callable, axes: tuple[str, ...]) -> Callable:
  """An initialiser whose parameter carries logical axis names (partitioning.py)."""
  return nn.with_logical_partitioning(init, axes)


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


class Implementation:
  """An attention implementation (one module of attention_implementations/ registers
  each): its `attend`, and what it declares that the rest reads instead of naming
  implementations: "auto" picks by `auto` and `fits`; the training log says where
  packed rows go (`packed_rows`); the roofline finds its kernels in a compiled program
  (`compiled_as`); the compile-only fit check turns a missing library into one line
  (`missing_library`); the tests run each where `platforms` and `dtypes` allow."""

  platforms: tuple[str, ...] = ("cpu", "gpu", "tpu")  # Where it runs.
  dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16")  # Compute dtypes it takes.
  auto = False  # Whether model.attention_implementation="auto" picks it where it fits.
  # "" if it masks packed rows (train.batching="packed") itself, else the line a run logs
  # about where they go instead.
  packed_rows = ""
  # Text in the custom-call target of its kernels in a compiled program ("fmha" for
  # cuDNN's); "" where XLA's own fusions compute it.
  compiled_as = ""

  def attend(self, q: jax.Array, k: jax.Array, v: jax.Array,
             mask: AttentionMask | None) -> jax.Array:
    """q [batch, q_len, heads, d], k and v [batch, k_len, heads, d] -> [batch, q_len,
    heads, d]: each query's softmax-weighted values, over the keys `mask` allows."""
    raise NotImplementedError

  def fits(self, cfg: ModelConfig, platform: str) -> bool:
    """Whether it computes `cfg`'s attention on `platform` ("cpu", "gpu", "tpu"):
    what "auto" asks. A subclass with further limits adds them."""
    return platform in self.platforms and cfg.dtype in self.dtypes

  def missing_library(self, error: Exception, target: str) -> str | None:
    """One line if compiling for `target` (a machine's name, or "" for this one) failed
    with `error` because a library it needs is not installed here; else None."""
    return None


DEFAULT_IMPLEMENTATION = "xla"  # What model.attention_implementation="" means.


def attention_implementation(cfg: ModelConfig) -> str:
  """The name of the implementation that computes `cfg`'s attention here:
  model.attention_implementation, "" being "xla"; "auto" picks the first (by name)
  that declares `auto` and fits on JAX's default backend (cuDNN's on a GPU in bfloat16
  where its limits allow), else "xla"."""
  name = cfg.attention_implementation or DEFAULT_IMPLEMENTATION
  if name != "auto":
    return name
  return next((name for name, choice in implementations().items()
               if choice.auto and choice.fits(cfg, jax.default_backend())),
              DEFAULT_IMPLEMENTATION)


def implementation(cfg: ModelConfig) -> Implementation:
  """The attention implementation `cfg` names, through the registry: the one place its
  name is dispatched."""
  return ATTENTION.get(attention_implementation(cfg), "config.model.attention_implementation")()


def implementations() -> dict[str, Implementation]:
  """Every registered attention implementation by name, each module imported."""
  return {name: ATTENTION.get(name, "config.model.attention_implementation")()
          for name in ATTENTION.names()}


class MultiHeadAttention(nn.Module):
  """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O (Sec. 3.2.2), no biases (biases
  on every projection with model.attention_bias, an option)."""

  config: ModelConfig

  @nn.compact
  def __call__(self, x_q: jax.Array, x_kv: jax.Array, mask: AttentionMask | None, *,
               deterministic: bool, use_cache: bool = False, cache_len: int = 0,
               static_kv: bool = False) -> jax.Array:
    """Decoding (`use_cache`) keeps a cache: self-attention appends each step's key and
    value to it (`cache_len` positions, allocated by the first, cache-building call);
    with `static_kv` (cross-attention: x_kv is the encoder output, the same at every
    step) the keys and values are projected once, by that first call, and then read.
    While decoding, x_kv may hold one row per sentence and x_q several consecutive
    rows per sentence (its beams), which then share that sentence's keys and values;
    the self-attention cache has a row per query row (see `select_cache_rows`).
    """
    cfg = self.config
    dtype = jnp.dtype(cfg.dtype)
    # Glorot over the [d_model, heads * head_dim] matrix each kernel really is, its
    # variance times model.qkv_init_scale.
    w_init = nn.initializers.variance_scaling(cfg.qkv_init_scale, "fan_avg", "uniform",
                                              in_axis=0, out_axis=(1, 2))
    kernel = lambda name, size: self.param(
        name, param_init(w_init, ("embed", "heads", "kv")),
        (cfg.d_model, cfg.num_heads, size)).astype(dtype)
    bias = lambda name, shape, axes: self.param(  # model.attention_bias, an option.
        name, param_init(nn.initializers.zeros, axes), shape).astype(dtype)

    def project(x, name, size):  # x [batch, length, d_model] -> [batch, length, heads, size]
      y = jnp.einsum("bld,dhk->blhk", x.astype(dtype), kernel(name, size))
      if cfg.attention_bias:
        y = y + bias(f"{name}_bias", (cfg.num_heads, size), ("heads", "kv"))
      return nn.with_logical_constraint(y, BATCH_LENGTH_HEADS_KV)

    q = project(x_q, "query", cfg.qk_dim)
    def project_kv():  # k: [batch, length, heads, d_k]; v: [batch, length, heads, d_v]
      return project(x_kv, "key", cfg.qk_dim), project(x_kv, "value", cfg.head_dim)
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
      out = _attend_cached(q, *self._extend_cache(*project_kv(), cache_len))
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
      out = implementation(cfg).attend(q, k, v, mask)
    out = nn.with_logical_constraint(out, BATCH_LENGTH_HEADS_KV)
    o_init = nn.initializers.variance_scaling(1.0, "fan_avg", "uniform", in_axis=(0, 1),
                                              out_axis=2)
    w_o = self.param("out", param_init(o_init, ("heads", "kv", "embed")),
                     (cfg.num_heads, cfg.head_dim, cfg.d_model)).astype(dtype)
    out = jnp.einsum("blhk,hkd->bld", out, w_o)  # Concat(heads) W^O.
    if cfg.attention_bias:
      out = out + bias("out_bias", (cfg.d_model,), ("embed",))
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


def _attend_cached(q: jax.Array, k: jax.Array, v: jax.Array,
                   mask: jax.Array | None) -> jax.Array:
  """Attention of one decoding step: q [rows, 1, heads, d_k] against cached k [batch,
  heads, length, d_k] and v [batch, heads, length, d_v], where rows = batch x n (n
  consecutive rows share a row of keys and values: cross-attention's, a sentence's for
  its beams; n = 1 for self-attention); mask broadcasts to [batch, 1, 1, length].
  Returns [rows, 1, heads, d_v]."""
  rows, _, heads, d_k = q.shape
  q = q.reshape(k.shape[0], rows // k.shape[0], heads, d_k)  # [batch, n, heads, d_k]
  logits = jnp.einsum("bnhd,bhkd->bhnk", q, k) / np.sqrt(d_k).astype(q.dtype)
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
  weights = jax.nn.softmax(logits.astype(jnp.float32)).astype(v.dtype)
  out = jnp.einsum("bhnk,bhkd->bnhd", weights, v)
  return out.reshape(rows, 1, heads, v.shape[-1])


# The decoding cache (Flax collection "cache") of each MultiHeadAttention: for
# self-attention the keys and values of the positions decoded so far, a row per
# hypothesis [rows, heads, length, d], and the next position to write; for
# cross-attention the encoder output's keys and values, a row per sentence. Under
# model.scan_layers every entry has a leading layers axis. A search changes the cache
# between steps only through these two functions.
_SELF_ATTENTION_CACHE = ("cached_key", "cached_value")


def _map_self_attention_cache(fn: Callable[[jax.Array], jax.Array], cache: Any) -> Any:
  return jax.tree_util.tree_map_with_path(
      lambda path, x: fn(x) if path[-1].key in _SELF_ATTENTION_CACHE else x, cache)


def grow_cache(cache: Any, length: int) -> Any:
  """The cache with room for `length` positions of self-attention keys and values."""
  def grow(x):
    pad = [(0, 0)] * (x.ndim - 2) + [(0, max(length - x.shape[-2], 0)), (0, 0)]
    return jnp.pad(x, pad)
  return _map_self_attention_cache(grow, cache)


def select_cache_rows(cache: Any, rows: jax.Array) -> Any:
  """The cache with row r of the self-attention keys and values taken from row rows[r]
  (beam search: a surviving hypothesis goes on from its parent's history)."""
  return _map_self_attention_cache(lambda x: jnp.take(x, rows, axis=x.ndim - 4), cache)
