"""The encoder-decoder Transformer of Vaswani et al. (2017), Sec. 3, in Flax linen.

Parameters carry logical axis names (`vocab`, `embed`, `heads`, `kv`, `mlp`, `length`)
and activations are constrained at block boundaries with `activation_*` names; a rules
table (see `partitioning.py`) maps both onto a device mesh. Without a mesh the
constraints do nothing.

Token id 0 is padding and doubles as the decoder's start symbol, as in tensor2tensor.
Multi-head attention and its masks are in attention.py.
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.kernels import placement
from transformer_jax.config import ModelConfig, PAD_ID
from transformer_jax.model.attention import AttentionMask, BATCH_LENGTH_EMBED
from transformer_jax.model.attention import MultiHeadAttention, param_init

# Logical names of activation axes, mapped to mesh axes by the rules table.
BATCH_LENGTH_MLP = ("activation_batch", "activation_length", "activation_mlp")
BATCH_LENGTH_VOCAB = ("activation_batch", "activation_length", "activation_vocab")

_glorot = nn.initializers.xavier_uniform


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


def shift_right(targets: jax.Array, segments: jax.Array | None = None) -> jax.Array:
  """Decoder input: the target shifted right by one, each sentence starting at PAD_ID."""
  shifted = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=PAD_ID)[:, :-1]
  if segments is not None:  # The first token of each packed sentence gets the start id.
    prev = jnp.pad(segments, ((0, 0), (1, 0)))[:, :-1]
    shifted = jnp.where(segments == prev, shifted, PAD_ID)
  return shifted


@jax.custom_vjp
def relu_from_output(x: jax.Array) -> jax.Array:
  """max(0, x), as jax.nn.relu (derivative 0 at 0), with a backward pass that reads its
  output instead of its input: the pre-activation then has one use, so on a GPU the
  compiler fuses the max (and the bias) into the matrix product's epilogue."""
  return jnp.maximum(x, 0)


def _relu_forward(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  y = relu_from_output(x)
  # Behind the barrier XLA cannot rewrite max(x, 0) > 0 as x > 0, a second use of x.
  return y, jax.lax.optimization_barrier(y)


def _relu_backward(y: jax.Array, g: jax.Array) -> tuple[jax.Array]:
  return (jnp.where(y > 0, g, jnp.zeros_like(g)),)


relu_from_output.defvjp(_relu_forward, _relu_backward)


def relu(x: jax.Array) -> jax.Array:
  """The paper's max(0, x) (Sec. 3.3): `relu_from_output` where the program is lowered
  for an NVIDIA GPU, jax.nn.relu elsewhere (a TPU fuses the max into the next product
  itself, and the barrier would keep a second [tokens, d_ff] array alive there)."""
  return jax.lax.platform_dependent(x, cuda=relu_from_output, default=jax.nn.relu)


# model.activation: the paper's ReLU (Sec. 3.3), or an imported model's.
ACTIVATIONS = {"relu": relu, "swish": nn.swish,
               "gelu": lambda x: nn.gelu(x, approximate=False)}


class FeedForward(nn.Module):
  """FFN(x) = max(0, x W1 + b1) W2 + b2 (Sec. 3.3); model.activation for another."""

  config: ModelConfig

  @nn.compact
  def __call__(self, x: jax.Array, *, deterministic: bool) -> jax.Array:
    cfg = self.config
    dtype = jnp.dtype(cfg.dtype)
    if cfg.ffn_kernel == "pallas":
      return self._fused(x, dtype)
    h = nn.Dense(cfg.d_ff, dtype=dtype, name="wi", **_dense_inits(WI_AXES))(x)
    h = nn.with_logical_constraint(ACTIVATIONS[cfg.activation](h), BATCH_LENGTH_MLP)
    h = nn.Dropout(cfg.relu_dropout_rate)(h, deterministic=deterministic)
    return nn.Dense(cfg.d_model, dtype=dtype, name="wo", **_dense_inits(WO_AXES))(h)

  def _fused(self, x: jax.Array, dtype) -> jax.Array:
    """The same function and parameters, the ReLU's gradient fused into the second
    product's (model.ffn_kernel="pallas", kernels/ffn.py); each device runs
    the kernel on its rows."""
    from transformer_jax.kernels import ffn  # Pallas: imported when used.
    cfg = self.config
    wi, bi = DenseParameters(cfg.d_ff, WI_AXES, name="wi")(x.shape[-1])
    wo, bo = DenseParameters(cfg.d_model, WO_AXES, name="wo")(cfg.d_ff)
    z = jax.lax.dot_general(x.astype(dtype), wi.astype(dtype),
                            (((x.ndim - 1,), (0,)), ((), ())))
    z = nn.with_logical_constraint(z, BATCH_LENGTH_MLP)
    fused = placement.on_row_shards(ffn.ffn_relu_product, (True, False, False), True)
    return fused(z, bi, wo) + bo.astype(dtype)


WI_AXES, WO_AXES = ("embed", "mlp"), ("mlp", "embed")  # The two products' kernels.


def _dense_inits(axes: tuple[str, str]) -> dict[str, Callable]:
  """A feed-forward product's initializers: Glorot-uniform kernel, zero bias."""
  return {"kernel_init": param_init(_glorot(), axes),
          "bias_init": param_init(nn.initializers.zeros, axes[1:])}


class DenseParameters(nn.Module):
  """nn.Dense's kernel and bias (the same names, shapes, initializers and axes: the
  same checkpoints), for a kernel that computes with them itself."""

  features: int
  axes: tuple[str, str]

  @nn.compact
  def __call__(self, in_features: int) -> tuple[jax.Array, jax.Array]:
    inits = _dense_inits(self.axes)
    return (self.param("kernel", inits["kernel_init"], (in_features, self.features)),
            self.param("bias", inits["bias_init"], (self.features,)))


def _layer_norm(cfg: ModelConfig, name: str) -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=cfg.layer_norm_epsilon, dtype=jnp.dtype(cfg.dtype), name=name,
                      scale_init=param_init(nn.initializers.ones, ("embed",)),
                      bias_init=param_init(nn.initializers.zeros, ("embed",)))


def _residual(cfg: ModelConfig, sublayer: Callable, x: jax.Array, norm_name: str,
              deterministic: bool) -> jax.Array:
  """Paper: LayerNorm(x + Dropout(Sublayer(x))) (Sec. 3.1, 5.4); option: pre-norm."""
  if cfg.norm_kernel == "pallas":
    return FusedResidualNorm(cfg, name=norm_name)(x, sublayer(x), deterministic)
  norm = _layer_norm(cfg, norm_name)
  drop = nn.Dropout(cfg.dropout_rate)
  if cfg.pre_norm:
    return x + drop(sublayer(norm(x)), deterministic=deterministic)
  return norm(x + drop(sublayer(x), deterministic=deterministic))


class FusedResidualNorm(nn.Module):
  """LayerNorm(x + Dropout(s)) in one Pallas kernel each way (model.norm_kernel="pallas",
  kernels/residual_norm.py), with nn.LayerNorm's parameters (the same checkpoints). Each
  device runs it on its rows; the dropout bits follow each element's place in the
  whole batch, so they do not depend on how the rows are split."""

  config: ModelConfig

  @nn.compact
  def __call__(self, x: jax.Array, s: jax.Array, deterministic: bool) -> jax.Array:
    from transformer_jax.kernels import residual_norm  # Pallas: imported when used.
    cfg, d = self.config, x.shape[-1]
    scale = self.param("scale", param_init(nn.initializers.ones, ("embed",)), (d,))
    bias = self.param("bias", param_init(nn.initializers.zeros, ("embed",)), (d,))
    rate = 0.0 if deterministic else cfg.dropout_rate
    key = (jax.random.bits(self.make_rng("dropout"), (2,), jnp.uint32) if rate
           else jnp.zeros((2,), jnp.uint32))
    axes = placement.row_axes()

    def norm(x, s, scale, bias, key):
      first = jax.lax.axis_index(axes) * x.shape[0] * x.shape[1] if axes else 0
      return residual_norm.residual_norm(x, s, scale, bias, key, rate=rate,
                                      epsilon=cfg.layer_norm_epsilon, first_row=first)

    fused = placement.on_row_shards(norm, (True, True, False, False, False), True)
    return fused(x, s.astype(x.dtype), scale, bias, key)


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
               use_cache: bool, cache_len: int = 0):
    cfg = self.config
    self_attend = MultiHeadAttention(cfg, name="self_attention")
    y = _residual(cfg, lambda z: self_attend(z, z, self_mask, deterministic=deterministic,
                                             use_cache=use_cache, cache_len=cache_len),
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
  def __call__(self, y, encoded, self_mask, cross_mask, deterministic, use_cache, cache_len):
    return DecoderLayer(self.config, name="layer")(
        y, encoded, self_mask, cross_mask, deterministic=deterministic, use_cache=use_cache,
        cache_len=cache_len), None


def _layer_stack(step: type[nn.Module], cfg: ModelConfig, length: int, broadcast: int,
                 name: str) -> nn.Module:
  """`length` layers as one scanned layer: parameters (and decoding caches) stacked on
  a leading "layers" axis, compiled once whatever the depth (model.scan_unroll layers a
  trip)."""
  return nn.scan(step, variable_axes={"params": 0, "cache": 0},
                 split_rngs={"params": True, "dropout": True},
                 in_axes=(nn.broadcast,) * broadcast, length=length,
                 unroll=min(cfg.scan_unroll, length),
                 metadata_params={nn.PARTITION_NAME: "layers"})(cfg, name=name)


class Embed(nn.Embed):
  """`nn.Embed` whose lookup gathers rows of the parameter (float32) and then casts them
  to the compute dtype: the same values, but the lookup's gradient, a scatter-add into
  the table, sums in float32. `nn.Embed` casts the whole table first, so under bfloat16
  its gradient adds the updates of every padding, EOS and frequent word to the same rows
  in bfloat16: less exact, and on an H200 a quarter of base's step (docs/results.md).
  `attend` (the tied output projection) is `nn.Embed`'s."""

  def __call__(self, inputs: jax.Array) -> jax.Array:
    if not jnp.issubdtype(inputs.dtype, jnp.integer):
      raise ValueError("Input type must be an integer or unsigned integer.")
    return jnp.take(self.embedding, inputs, axis=0).astype(jnp.dtype(self.dtype))


class Embedder(nn.Module):
  """Token embedding times sqrt(d_model) (Sec. 3.4) plus position encoding (Sec. 3.5)."""

  config: ModelConfig
  token_embed: Embed

  @nn.compact
  def __call__(self, tokens: jax.Array, positions: jax.Array, *,
               deterministic: bool) -> jax.Array:
    cfg = self.config
    x = self.token_embed(tokens) * jnp.asarray(np.sqrt(cfg.d_model), jnp.dtype(cfg.dtype))
    if cfg.learned_positions:
      table = self.param("position_embedding",
                         param_init(nn.initializers.normal(np.sqrt(0.5)),
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
    embed = lambda name: Embed(
        cfg.padded_vocab_size, cfg.d_model, dtype=jnp.dtype(cfg.dtype), name=name,
        # Unit-variance embeddings after the sqrt(d_model) scaling.
        embedding_init=param_init(nn.initializers.normal(cfg.d_model**-0.5),
                                   ("vocab", "embed")))
    if cfg.share_embeddings:
      self.source_embed = self.target_embed = embed("embed")
    else:
      self.source_embed, self.target_embed = embed("source_embed"), embed("target_embed")
      self.output_projection = nn.Dense(
          cfg.padded_vocab_size, use_bias=False, dtype=jnp.dtype(cfg.dtype), name="logits",
          kernel_init=param_init(_glorot(), ("embed", "vocab")))
    if cfg.logits_bias:  # An option (MarianMT's final_logits_bias).
      self.logits_bias = self.param("logits_bias", param_init(nn.initializers.zeros,
                                                              ("vocab",)), (cfg.vocab_size,))
    self.source_embedder = Embedder(cfg, self.source_embed, name="source_embedder")
    self.target_embedder = Embedder(cfg, self.target_embed, name="target_embedder")
    if cfg.scan_layers:
      self.encoder_stack = _layer_stack(_ScanEncoderStep, cfg, cfg.num_encoder_layers, 2,
                                        "encoder_stack")
      self.decoder_stack = _layer_stack(_ScanDecoderStep, cfg, cfg.num_decoder_layers, 6,
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
             cache_len: int = 0, project: bool = True) -> jax.Array:
    """Logits [batch, tgt_len, vocab] for `targets`, in the compute dtype (model.dtype);
    with `project=False`, the decoder's output states [batch, tgt_len, d_model].

    Training: `targets` is the whole target; the decoder reads it shifted right.
    Decoding (`use_cache=True`): `targets` is the previous token [batch, 1] and
    `targets_positions` its position; keys and values come from the cache, which the
    first call builds (`cache_len` positions; the encoder output's keys and values
    for cross-attention, projected once; see attention.grow_cache and
    attention.select_cache_rows for what a search may do to it).
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
                                cache_len)
    else:
      for layer in self.decoder_layers:
        y = layer(y, encoded, self_mask, cross_mask, deterministic=deterministic,
                  use_cache=use_cache, cache_len=cache_len)
    if self.config.pre_norm:
      y = self.decoder_norm(y)
    return self.project(y) if project else y

  def output_embedding(self) -> jax.Array:
    """The output projection's rows [padded vocab, d_model] in the compute dtype: the
    tied embedding (Sec. 3.4), or the untied projection's kernel transposed."""
    if self.config.share_embeddings:
      matrix = self.target_embed.embedding
    else:
      matrix = self.output_projection.variables["params"]["kernel"].T
    return matrix.astype(jnp.dtype(self.config.dtype))

  def project(self, y: jax.Array) -> jax.Array:
    """Decoder states [..., d_model] -> logits [..., vocab] in the compute dtype."""
    if self.config.share_embeddings:
      logits = self.target_embed.attend(y)  # Pre-softmax projection = embedding^T.
    else:
      logits = self.output_projection(y)
    logits = logits[..., :self.config.vocab_size]  # Padded ids (vocab_multiple) never win.
    if self.config.logits_bias:
      logits = logits + self.logits_bias.astype(logits.dtype)
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


def init_params(model: Transformer, rng: jax.Array, length: int = 8) -> Any:
  """Freshly initialised parameters, boxed with their logical axis names."""
  dummy = jnp.ones((1, length), jnp.int32)
  return model.init(rng, dummy, dummy)["params"]

