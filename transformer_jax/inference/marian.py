"""MarianMT's weights and this project's parameters, each computed from the other
exactly (`marian_tensors`, `params_from_marian`): the tensor names and layouts of
transformers' MarianMTModel state dict, with two conventions mapped.

- Positions. MarianMT's sinusoids are not interleaved: the sines fill the first half of
  the model dimension and the cosines the second, where Sec. 3.5's (and this
  project's) alternate. Every tensor's model dimension is permuted to match
  (`hidden_order`): a permutation of that dimension changes nothing the model computes
  (layer norms, residuals and products see the same sums in another order), and it is
  exact both ways.
- Ids. Marian numbers its vocabulary its own way (OPUS-MT: EOS 0, unknown 1, padding
  last); this project needs padding, EOS and unknown at 0, 1, 2. `marian_ids[i]` is id
  i's id there (`tokenizer.Marian.marian_ids`; the identity for a SentencePiece run).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import flax.linen as nn
import jax
import numpy as np

from transformer_jax import config as config_lib
from transformer_jax.inference import ctranslate2
from transformer_jax.model.transformer import init_params, Transformer


def hidden_order(d_model: int) -> np.ndarray:
  """MarianMT's model dimension j is this project's hidden_order(d)[j]: the sines'
  columns 0, 2, 4, ... first, then the cosines' 1, 3, 5, ..."""
  return np.concatenate([np.arange(0, d_model, 2), np.arange(1, d_model, 2)])


# How each of a layer's parameters maps to MarianMT's tensors: (path in this project's
# layer, Marian name, kind). Kinds: "in" a kernel [d_model, ...] read by a Linear
# (Marian's weight [out, in]); "out" a kernel [..., d_model] that writes the model
# dimension; "hidden" a vector over it; "flat" anything else, only reshaped.
def _attention(ours: str, theirs: str) -> list[tuple[tuple[str, ...], str, str]]:
  rows = []
  for name, proj in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
    rows += [((ours, name), f"{theirs}.{proj}.weight", "in"),
             ((ours, f"{name}_bias"), f"{theirs}.{proj}.bias", "flat")]
  return rows + [((ours, "out"), f"{theirs}.out_proj.weight", "out"),
                 ((ours, "out_bias"), f"{theirs}.out_proj.bias", "hidden")]


def _norm(ours: str, theirs: str) -> list[tuple[tuple[str, ...], str, str]]:
  return [((ours, "scale"), f"{theirs}.weight", "hidden"),
          ((ours, "bias"), f"{theirs}.bias", "hidden")]


_FFN = [(("ffn", "wi", "kernel"), "fc1.weight", "in"), (("ffn", "wi", "bias"), "fc1.bias", "flat"),
        (("ffn", "wo", "kernel"), "fc2.weight", "out"),
        (("ffn", "wo", "bias"), "fc2.bias", "hidden")]
_ENCODER_LAYER = (_attention("self_attention", "self_attn")
                  + _norm("self_attention_norm", "self_attn_layer_norm") + _FFN
                  + _norm("ffn_norm", "final_layer_norm"))
_DECODER_LAYER = (_attention("self_attention", "self_attn")
                  + _norm("self_attention_norm", "self_attn_layer_norm")
                  + _attention("cross_attention", "encoder_attn")
                  + _norm("cross_attention_norm", "encoder_attn_layer_norm") + _FFN
                  + _norm("ffn_norm", "final_layer_norm"))


def _layer_tensors(cfg: config_lib.ModelConfig) -> Iterator[tuple[tuple, str, str]]:
  """(path in the unscanned parameters, Marian name, kind) of every layer tensor,
  attention biases included whether or not the config has them."""
  for stack, count, rows in (("encoder", cfg.num_encoder_layers, _ENCODER_LAYER),
                             ("decoder", cfg.num_decoder_layers, _DECODER_LAYER)):
    for i in range(count):
      for path, name, kind in rows:
        yield (f"{stack}_{i}", *path), f"model.{stack}.layers.{i}.{name}", kind


def is_attention_bias(name: str) -> bool:
  return name.endswith("_proj.bias")


def unscanned(params: dict[str, Any], cfg: config_lib.ModelConfig) -> dict[str, Any]:
  """The parameters with scanned stacks (model.scan_layers) as `encoder_i`, `decoder_i`."""
  out = {k: v for k, v in params.items() if not k.endswith("_stack")}
  for prefix, count in (("encoder", cfg.num_encoder_layers),
                        ("decoder", cfg.num_decoder_layers)):
    for i, layer in enumerate(ctranslate2.unstacked(params, prefix, count)):
      out[f"{prefix}_{i}"] = layer
  return out


def scanned(params: dict[str, Any], cfg: config_lib.ModelConfig) -> dict[str, Any]:
  """`unscanned`'s inverse where the config scans its layers; else `params`."""
  if not cfg.scan_layers:
    return params
  out = dict(params)
  for prefix, count in (("encoder", cfg.num_encoder_layers),
                        ("decoder", cfg.num_decoder_layers)):
    layers = [out.pop(f"{prefix}_{i}") for i in range(count)]
    out[f"{prefix}_stack"] = {"layer": jax.tree.map(lambda *x: np.stack(x), *layers)}
  return out


def _get(tree: dict[str, Any], path: tuple[str, ...]) -> Any:
  for key in path:
    tree = tree[key]
  return tree


def _put(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


# Each kind's conversion, this project's -> MarianMT's, given the model dimension's
# order; and back.
def _to_marian(kind: str, x: np.ndarray, order: np.ndarray) -> np.ndarray:
  if kind == "in":
    return x.reshape(x.shape[0], -1)[order].T
  if kind == "out":
    return x.reshape(-1, x.shape[-1])[:, order].T
  return x[order] if kind == "hidden" else x.reshape(-1)


def _from_marian(kind: str, x: np.ndarray, inverse: np.ndarray, shape: tuple[int, ...]
                 ) -> np.ndarray:
  if kind == "in":
    return x.T[inverse].reshape(shape)
  if kind == "out":
    return x.T[:, inverse].reshape(shape)
  return x[inverse] if kind == "hidden" else x.reshape(shape)


def marian_tensors(params: Any, cfg: config_lib.ModelConfig, marian_ids: list[int]
                   ) -> dict[str, np.ndarray]:
  """MarianMTModel's state dict (float32 numpy) of this project's parameters;
  `marian_ids[i]` is id i's id there."""
  params = unscanned(jax.tree.map(np.asarray, nn.meta.unbox(params)), cfg)
  f32 = lambda x: np.ascontiguousarray(x, np.float32)
  order, vocab = hidden_order(cfg.d_model), len(marian_ids)
  rows = np.argsort(marian_ids)  # Marian's id m is this project's id rows[m].
  out = {}
  for path, name, kind in _layer_tensors(cfg):
    if is_attention_bias(name) and not cfg.attention_bias:  # The paper's: none.
      out[name] = np.zeros(cfg.d_model, np.float32)
    else:
      out[name] = f32(_to_marian(kind, _get(params, path), order))
  embedding = lambda table: f32(table[:vocab][rows][:, order])
  if cfg.share_embeddings:
    out["model.shared.weight"] = embedding(params["embed"]["embedding"])
  else:
    out["model.encoder.embed_tokens.weight"] = embedding(params["source_embed"]["embedding"])
    out["model.decoder.embed_tokens.weight"] = embedding(params["target_embed"]["embedding"])
    out["lm_head.weight"] = embedding(params["logits"]["kernel"].T)
  bias = params["logits_bias"] if cfg.logits_bias else np.zeros(vocab, np.float32)
  out["final_logits_bias"] = f32(bias[rows][None])
  return out


def params_from_marian(tensors: dict[str, np.ndarray], cfg: config_lib.ModelConfig,
                       marian_ids: list[int]) -> dict[str, Any]:
  """`marian_tensors`' inverse: this project's parameters (numpy, unboxed, in the
  config's layout) of a MarianMTModel state dict."""
  inverse = np.argsort(hidden_order(cfg.d_model))
  ids = np.asarray(marian_ids)
  flat = dataclasses.replace(cfg, scan_layers=False)
  shapes = jax.eval_shape(lambda rng: nn.meta.unbox(init_params(Transformer(flat), rng)),
                          jax.random.key(0))
  params: dict[str, Any] = {}
  for path, name, kind in _layer_tensors(cfg):
    if cfg.attention_bias or not is_attention_bias(name):
      _put(params, path, _from_marian(kind, tensors[name], inverse,
                                      _get(shapes, path).shape))
  padding = cfg.padded_vocab_size - len(ids)
  embedding = lambda table: np.pad(table[ids][:, inverse], ((0, padding), (0, 0)))
  if cfg.share_embeddings:
    shared = tensors.get("model.shared.weight", tensors.get("model.encoder.embed_tokens.weight"))
    params["embed"] = {"embedding": embedding(shared)}
  else:
    params["source_embed"] = {"embedding": embedding(tensors["model.encoder.embed_tokens.weight"])}
    params["target_embed"] = {"embedding": embedding(tensors["model.decoder.embed_tokens.weight"])}
    params["logits"] = {"kernel": embedding(tensors["lm_head.weight"]).T}
  if cfg.logits_bias:
    params["logits_bias"] = tensors["final_logits_bias"][0][ids]
  return scanned(params, cfg)
