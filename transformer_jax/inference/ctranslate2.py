"""Trained weights for serving engines: a CTranslate2 model (`export.py` writes it,
`translate.py --ctranslate2=DIR` translates with it).

The model directory holds the weights in CTranslate2's layout (the paper's post-norm
layers, or pre-norm where model.pre_norm was set), this project's position encodings
(the paper's interleaved sinusoids, or the learned table), its SentencePiece
vocabulary (the pieces in id order), its start symbol (the padding piece, id 0), end
symbol (id 1) and unknown piece (id 2), and the source EOS that this project's
tokenizer appends.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np

from transformer_jax import config as config_lib, files, stop_policy
from transformer_jax.config import PAD_ID
from transformer_jax.data.tokenizer import Subwords
from transformer_jax.inference import restore
from transformer_jax.model.transformer import sinusoidal_position_encoding


def unstacked(params: dict[str, Any], prefix: str, count: int) -> list[dict[str, Any]]:
  """Each layer's parameters, from `prefix_i` or a scanned `prefix_stack`."""
  if f"{prefix}_stack" in params:
    stack = params[f"{prefix}_stack"]["layer"]
    return [jax.tree.map(lambda x, i=i: x[i], stack) for i in range(count)]
  return [params[f"{prefix}_{i}"] for i in range(count)]


def ctranslate2_spec(params: dict[str, Any], cfg: config_lib.ModelConfig,
                     pieces: list[str]) -> Any:
  """The CTranslate2 TransformerSpec of these parameters (numpy, unboxed)."""
  with stop_policy.stops_held():
    from ctranslate2.specs import transformer_spec  # The optional extra.

  _check_exportable(cfg)
  spec = transformer_spec.TransformerSpec.from_config(
      (cfg.num_encoder_layers, cfg.num_decoder_layers), cfg.num_heads,
      pre_norm=cfg.pre_norm)
  _set_embeddings(spec, params, cfg, len(pieces))
  encoder, decoder = spec.encoder, spec.decoder
  for layer, p in zip(encoder.layer, unstacked(params, "encoder", cfg.num_encoder_layers)):
    _attention(layer.self_attention, p["self_attention"], fused_query=True)
    _norm(layer.self_attention.layer_norm, p["self_attention_norm"])
    _ffn(layer.ffn, p["ffn"])
    _norm(layer.ffn.layer_norm, p["ffn_norm"])
  for layer, p in zip(decoder.layer, unstacked(params, "decoder", cfg.num_decoder_layers)):
    _attention(layer.self_attention, p["self_attention"], fused_query=True)
    _norm(layer.self_attention.layer_norm, p["self_attention_norm"])
    _attention(layer.attention, p["cross_attention"], fused_query=False)
    _norm(layer.attention.layer_norm, p["cross_attention_norm"])
    _ffn(layer.ffn, p["ffn"])
    _norm(layer.ffn.layer_norm, p["ffn_norm"])
  if cfg.pre_norm:
    _norm(encoder.layer_norm, params["encoder_norm"])
    _norm(decoder.layer_norm, params["decoder_norm"])

  spec.config.layer_norm_epsilon = cfg.layer_norm_epsilon
  # Id 0 is padding and the decoder's start symbol, 1 EOS, 2 unknown (data/tokenizer.py);
  # sources end with EOS.
  spec.config.decoder_start_token = spec.config.bos_token = pieces[0]
  spec.config.eos_token, spec.config.unk_token = pieces[1], pieces[2]
  spec.config.add_source_eos = True
  spec.register_source_vocabulary(pieces)
  spec.register_target_vocabulary(pieces)
  return spec


def _check_exportable(cfg: config_lib.ModelConfig) -> None:
  """CTranslate2's Transformer is the paper's: one line for each option it lacks."""
  if cfg.qk_dim != cfg.head_dim:
    raise ValueError(f"model.key_dim={cfg.key_dim}: CTranslate2 needs query/key and value "
                     "heads of one size (key_dim=0).")
  for name, value, paper in (("activation", cfg.activation, "relu"),
                             ("attention_bias", cfg.attention_bias, False),
                             ("logits_bias", cfg.logits_bias, False)):
    if value != paper:  # Imported models' options: export those with --format=huggingface.
      raise ValueError(f"model.{name}={value!r}: this export writes the paper's model "
                       f"({name}={paper!r}); export with --format=huggingface.")


def _f32(x) -> np.ndarray:
  return np.asarray(x, np.float32)


def _set_embeddings(spec, params, cfg: config_lib.ModelConfig, vocab: int) -> None:
  """Both embeddings, their positions and the output projection (the target embedding
  where they are shared)."""
  if cfg.share_embeddings:
    source_embed = target_embed = _f32(params["embed"]["embedding"])[:vocab]
    projection = target_embed
  else:
    source_embed = _f32(params["source_embed"]["embedding"])[:vocab]
    target_embed = _f32(params["target_embed"]["embedding"])[:vocab]
    projection = _f32(params["logits"]["kernel"]).T[:vocab]

  def positions(embedder: str) -> np.ndarray:
    if cfg.learned_positions:
      return _f32(params[embedder]["position_embedding"])
    return sinusoidal_position_encoding(cfg.max_len, cfg.d_model)

  spec.encoder.embeddings[0].weight = source_embed
  spec.encoder.position_encodings.encodings = positions("source_embedder")
  spec.decoder.embeddings.weight = target_embed
  spec.decoder.position_encodings.encodings = positions("target_embedder")
  spec.decoder.projection.weight = projection


def _norm(spec_norm, p) -> None:
  spec_norm.gamma, spec_norm.beta = _f32(p["scale"]), _f32(p["bias"])


def _dense(spec_linear, *kernels, bias=None) -> None:
  """x @ kernel ([d_in, ...out dims]) as CTranslate2's [out, in] weight, stacked."""
  spec_linear.weight = np.concatenate([_f32(k).reshape(k.shape[0], -1).T for k in kernels])
  if bias is not None:
    spec_linear.bias = _f32(bias)


def _attention(spec_attention, p, fused_query: bool) -> None:
  if fused_query:  # Self-attention: one [3 d, d] projection.
    _dense(spec_attention.linear[0], p["query"], p["key"], p["value"])
  else:  # Cross-attention: queries from the decoder, keys and values from the encoder.
    _dense(spec_attention.linear[0], p["query"])
    _dense(spec_attention.linear[1], p["key"], p["value"])
  out = _f32(p["out"])  # [heads, head_dim, d_model]
  _dense(spec_attention.linear[-1], out.reshape(-1, out.shape[-1]))


def _ffn(spec_ffn, p) -> None:
  _dense(spec_ffn.linear_0, p["wi"]["kernel"], bias=p["wi"]["bias"])
  _dense(spec_ffn.linear_1, p["wo"]["kernel"], bias=p["wo"]["bias"])


def export_ctranslate2(workdir: str, output: str, step: int | str | None = None,
                       average_last: int = 1, quantization: str | None = None) -> str:
  """Writes the run's (averaged) checkpoint as a CTranslate2 model to `output`."""
  trained = restore.load_workdir(workdir)
  params, _, words = restore.chosen_params(trained, average_last, step)
  logging.info("Exporting %s of %s to %s", words, workdir, output)
  return save_ctranslate2(params, trained.cfg.model, trained.tokenizer.pieces(), output,
                          quantization)


def save_ctranslate2(params: Any, model_cfg: config_lib.ModelConfig, pieces: list[str],
                     output: str, quantization: str | None = None) -> str:
  """Writes `params` as a CTranslate2 model directory `output` (replaced if present)."""
  try:
    with stop_policy.stops_held():
      import ctranslate2.converters
  except ImportError:
    raise ValueError("CTranslate2 is not installed: pip install -e '.[export]'") from None
  spec = ctranslate2_spec(jax.tree.map(np.array, nn.meta.unbox(params)), model_cfg,
                          pieces)

  class _Converter(ctranslate2.converters.Converter):
    def _load(self):
      return spec

  staging = files.staging_dir(output)  # Whole or not there: replaced only when done.
  try:
    _Converter().convert(os.fspath(staging), quantization=quantization, force=True)
    files.replace_dir(staging, output)
  finally:
    if staging.exists():
      shutil.rmtree(staging)
  return output


def ctranslate2_translator(directory: str):
  """A CTranslate2 translator for the model exported to `directory`, on every core."""
  try:
    with stop_policy.stops_held():
      import ctranslate2
  except ImportError:
    raise ValueError("CTranslate2 is not installed: pip install -e '.[export]'") from None
  if not os.path.exists(os.path.join(directory, "model.bin")):
    raise FileNotFoundError(f"{directory} holds no CTranslate2 model (model.bin); write "
                            "one with python -m transformer_jax.export.")
  return ctranslate2.Translator(directory, device="cpu", intra_threads=os.cpu_count() or 1)


# CTranslate2's beam search stops once beam_size x patience hypotheses have finished; at
# patience 1 those can be early, cut-off ones that ours (model/beam_search.py: it stops
# only when no unfinished hypothesis can still win) would outlive. On the embedded
# default, patience 1 cost 1.8 BLEU; from 2 on the outputs were ours (docs/evaluation.md).
CTRANSLATE2_PATIENCE = 4


def ctranslate2_length_penalty(alpha: float, length: float) -> float:
  """CTranslate2 divides log P by |Y|^a; Sec. 6.1's penalty is ((5 + |Y|) / 6)^alpha.
  The nearest a around a typical `length`: the same slope of the log penalty over
  log |Y|, alpha * length / (5 + length)."""
  return alpha * length / (5.0 + length)


def ctranslate2_translate_ids(translator, pieces: list[str], encoded: Sequence[Sequence[int]],
                              decode_cfg: config_lib.DecodeConfig, nbest: int = 0
                              ) -> list[Any]:
  """translation.translate_ids, by CTranslate2's own beam search, set to decode as ours
  does: its length penalty nearest ours around the sources' mean length (alpha as it is
  with length_penalty_form "fairseq", the same form), searching until no shorter finish
  can win (CTRANSLATE2_PATIENCE), each output ending where ours would."""
  ids = {piece: i for i, piece in enumerate(pieces)}
  alpha = decode_cfg.length_penalty if decode_cfg.length_penalty_form == "fairseq" else \
      ctranslate2_length_penalty(decode_cfg.length_penalty,
                                 float(np.mean([len(r) for r in encoded] or [0])))
  results = [None] * len(encoded)
  # Ours ends a source of n ids (EOS included) by n + max_extra_length ids, the last an
  # EOS; CTranslate2 counts no EOS that its limit forces, and its limit is one a call: a
  # call for each source length (one batch would let a short source's output run on
  # to the longest source's limit).
  by_length = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
  for length, rows in itertools.groupby(by_length, key=lambda i: len(encoded[i])):
    rows = list(rows)
    outputs = translator.translate_batch(
        [[pieces[i] for i in encoded[r][:-1]] for r in rows],  # It appends the EOS.
        max_batch_size=decode_cfg.batch_size, beam_size=decode_cfg.beam_size,
        length_penalty=alpha, patience=CTRANSLATE2_PATIENCE,
        num_hypotheses=max(nbest, 1), return_scores=bool(nbest), min_decoding_length=0,
        suppress_sequences=[[pieces[PAD_ID]]],  # Never the padding id, as ours (beam_search.py).
        max_decoding_length=length + decode_cfg.max_extra_length - 1)
    for r, output in zip(rows, outputs):
      results[r] = output
  as_ids = lambda hypothesis: [ids[p] for p in hypothesis]
  if nbest:
    return [[(as_ids(h), s) for h, s in zip(r.hypotheses, r.scores)] for r in results]
  return [as_ids(r.hypotheses[0]) for r in results]


def translate_ctranslate2(translator, tok: Subwords, sources: Sequence[str],
                          decode_cfg: config_lib.DecodeConfig, nbest: int = 0) -> list[Any]:
  """translation.translate, by `translator` (an exported model) with the run's tokenizer."""
  outputs = ctranslate2_translate_ids(translator, tok.pieces(), tok.encode(sources),
                                      decode_cfg, nbest)
  if nbest:
    return [[(tok.decode(ids), score) for ids, score in best] for best in outputs]
  return [tok.decode(ids) for ids in outputs]
