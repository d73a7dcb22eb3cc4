"""Hugging Face's MarianMT format, both ways: a run as a folder that transformers'
`MarianMTModel` and `MarianTokenizer` load with no code of ours (`export
--format=huggingface`), and such a folder read to make a run (`import_model`); and
translating with transformers (`evaluate --huggingface`). Neither direction needs
PyTorch or transformers: the weights are safetensors (mapped in marian.py), the rest
JSON and the tokenizer's files.

MarianMT is the paper's architecture (post-norm, sinusoidal positions, embeddings
scaled by sqrt(d_model) and shared). Its LayerNorm epsilon is PyTorch's 1e-5, not
tensor2tensor's 1e-6 (this project's default, `model.layer_norm_epsilon`): an export of
such a run computes with 1e-5 in transformers, about 5e-6 relative in each
normalization (docs/interop.md: what it moved in the tests). Imports set 1e-5.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from typing import Any

import numpy as np
from etils import epath

from transformer_jax import config as config_lib, files, stop_policy
from transformer_jax.config import EOS_ID, PAD_ID, UNK_ID
from transformer_jax.data import corpora, tokenizer as tokenizer_lib
from transformer_jax.inference import ctranslate2, marian, restore

WEIGHTS = "model.safetensors"
MARIAN_EPSILON = 1e-5  # torch.nn.LayerNorm's, which MarianMT's layers use.
# MarianMT's name for each model.activation (and the names it reads back).
ACTIVATIONS = {"relu": "relu", "swish": "swish", "gelu": "gelu"}
FROM_ACTIVATION = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu",
                   "gelu_python": "gelu"}
# transformers' beam search divides log P by |Y|^a (|Y| with the EOS): this project's
# length_penalty_form "fairseq". For the paper's "gnmt" form, generation_config.json
# gets the nearest a around a sentence of this many subwords.
TYPICAL_LENGTH = 25.0


def unsupported(cfg: config_lib.Config) -> str | None:
  """Why MarianMT cannot express this run (one line), or None."""
  m, d = cfg.model, cfg.data
  if m.pre_norm:
    return "model.pre_norm=True: MarianMT's layers are post-norm (the paper's)"
  if m.learned_positions:
    return "model.learned_positions=True: MarianMT's positions are fixed sinusoids"
  if m.qk_dim != m.head_dim:
    return f"model.key_dim={m.key_dim}: MarianMT's query/key and value heads are one size"
  if d.tokenizer_type == "subword_nmt":
    return 'data.tokenizer_type="subword_nmt": MarianTokenizer reads SentencePiece models'
  if d.pretokenize:
    return f"data.pretokenize={d.pretokenize!r}: MarianTokenizer reads raw text"
  return None


def tokenizer_files(tok: tokenizer_lib.Subwords) -> tuple[bytes, bytes, list[str]]:
  """(source.spm, target.spm, the vocabulary in Marian's id order) of a run's tokenizer."""
  if isinstance(tok, tokenizer_lib.Marian):
    return tok.source_spm, tok.target_spm, tok.marian_vocabulary
  model = tok.model_file.read_bytes()  # One SentencePiece model for both sides.
  return model, model, tok.pieces()


def marian_ids(tok: tokenizer_lib.Subwords) -> list[int]:
  """Each of the run's ids' id in the Marian model: an imported tokenizer's, or the same."""
  return list(getattr(tok, "marian_ids", range(tok.vocab_size)))


def write_folder(output: str, tensors: dict[str, np.ndarray], cfg: config_lib.Config,
                 tok: tokenizer_lib.Subwords, card: str) -> str:
  """Writes the MarianMT folder `output` whole or not at all (built beside it, then
  renamed into place; a folder already there is replaced only then)."""
  from safetensors.numpy import save_file

  source_spm, target_spm, vocabulary = tokenizer_files(tok)
  ids = marian_ids(tok)
  pad, eos, unk = (ids[i] for i in (PAD_ID, EOS_ID, UNK_ID))
  output_path = epath.Path(output)
  staging = files.staging_dir(output_path)
  try:
    save_file(tensors, os.fspath(staging / WEIGHTS), metadata={"format": "pt"})
    os.chmod(staging / WEIGHTS, 0o666 & ~files.umask())  # safetensors writes it 0600.
    write_json = lambda name, value: (staging / name).write_text(
        json.dumps(value, indent=2, ensure_ascii=False) + "\n")
    write_json("config.json", marian_config(cfg, len(vocabulary), pad, eos))
    write_json("generation_config.json", generation_config(cfg, pad, eos))
    write_json("vocab.json", {piece: i for i, piece in enumerate(vocabulary)})
    (staging / "source.spm").write_bytes(source_spm)
    (staging / "target.spm").write_bytes(target_spm)
    write_json("tokenizer_config.json", {
        "tokenizer_class": "MarianTokenizer", "source_lang": cfg.data.source_lang,
        "target_lang": cfg.data.target_lang, "model_max_length": cfg.model.max_len,
        "separate_vocabs": False, "pad_token": vocabulary[pad], "eos_token": vocabulary[eos],
        "unk_token": vocabulary[unk]})
    (staging / "README.md").write_text(card)
    files.replace_dir(staging, output_path)
  finally:
    if staging.exists():
      shutil.rmtree(staging)
  return str(output_path)


def marian_config(cfg: config_lib.Config, vocab: int, pad: int, eos: int) -> dict[str, Any]:
  """MarianMT's config.json for this run's model."""
  m = cfg.model
  return {
      "architectures": ["MarianMTModel"], "model_type": "marian", "vocab_size": vocab,
      "decoder_vocab_size": vocab, "d_model": m.d_model,
      "encoder_layers": m.num_encoder_layers, "decoder_layers": m.num_decoder_layers,
      "encoder_attention_heads": m.num_heads, "decoder_attention_heads": m.num_heads,
      "encoder_ffn_dim": m.d_ff, "decoder_ffn_dim": m.d_ff,
      "activation_function": ACTIVATIONS[m.activation],
      "max_position_embeddings": m.max_len, "scale_embedding": True,
      "share_encoder_decoder_embeddings": m.share_embeddings,
      "tie_word_embeddings": m.share_embeddings,
      "pad_token_id": pad, "decoder_start_token_id": pad, "eos_token_id": eos,
      "forced_eos_token_id": eos, "bos_token_id": None,
      "dropout": m.dropout_rate, "attention_dropout": m.attention_dropout_rate,
      "activation_dropout": m.relu_dropout_rate, "is_encoder_decoder": True,
      "use_cache": True, "dtype": "float32"}


def generation_config(cfg: config_lib.Config, pad: int, eos: int) -> dict[str, Any]:
  """generation_config.json: the run's beam, its length penalty in transformers' form
  (|Y|^a: the run's alpha if its form is "fairseq", else the a nearest the paper's
  ((5 + |Y|) / 6)^alpha around TYPICAL_LENGTH subwords), never the padding id, EOS
  forced at the limit. transformers' limit is one number, not each source's length +
  decode.max_extra_length: here the longest training sentence's plus that."""
  d = cfg.decode
  alpha = d.length_penalty if d.length_penalty_form == "fairseq" else round(
      ctranslate2.ctranslate2_length_penalty(d.length_penalty, TYPICAL_LENGTH), 4)
  return {"decoder_start_token_id": pad, "pad_token_id": pad, "eos_token_id": eos,
          "forced_eos_token_id": eos, "bad_words_ids": [[pad]], "num_beams": d.beam_size,
          "length_penalty": alpha, "early_stopping": "never",
          "max_length": min(cfg.model.max_len, cfg.data.max_length + d.max_extra_length)}


def export_huggingface(workdir: str, output: str, step: int | str | None = None,
                       average_last: int = 1, command: str = "") -> str:
  """Writes the run's chosen checkpoint(s) as a MarianMT folder `output`; a run that
  MarianMT cannot express raises ValueError (one line) and writes nothing."""
  trained = restore.load_workdir(workdir)
  why = unsupported(trained.cfg)
  if why:
    raise ValueError(f"{workdir} cannot be exported as MarianMT: {why}.")
  params, steps, words = restore.chosen_params(trained, average_last, step)
  logging.info("Exporting %s of %s to %s", words, workdir, output)
  tensors = marian.marian_tensors(params, trained.cfg.model, marian_ids(trained.tokenizer))
  return write_folder(output, tensors, trained.cfg, trained.tokenizer,
                      model_card(trained, words, command))


def model_card(trained: restore.TrainedModel, words: str, command: str) -> str:
  """README.md: what the model is, what it was trained on, its scores, how it was made."""
  cfg, m = trained.cfg, trained.cfg.model
  results = epath.Path(trained.workdir) / "results.json"
  scores = json.loads(results.read_text()) if results.exists() else {}
  data = corpora.named(cfg.data)
  lines = [
      "---", "library_name: transformers", "pipeline_tag: translation",
      f"language: [{cfg.data.source_lang}, {cfg.data.target_lang}]", "---", "",
      f"# {cfg.data.source_lang}-{cfg.data.target_lang}: a Transformer trained with "
      "transformer-jax", "",
      "The encoder-decoder Transformer of Vaswani et al. (2017), trained in JAX with "
      "transformer-jax and exported as a MarianMT model.", "",
      f"- Model: {m.num_encoder_layers}+{m.num_decoder_layers} layers, d_model {m.d_model}, "
      f"{m.num_heads} heads, feed-forward {m.d_ff} ({m.activation}), vocabulary "
      f"{m.vocab_size}, {'shared' if m.share_embeddings else 'separate'} embeddings.",
      f"- Trained on: {data} ({cfg.data.source_lang} -> {cfg.data.target_lang}), "
      f"{cfg.train.num_train_steps} steps; exported: {words} of `{trained.workdir}`.",
      f"- Decoding as trained: {cfg.decode.describe()} "
      "(generation_config.json holds transformers' nearest settings)."]
  if scores:
    shown = {k: v for k, v in sorted(scores.items()) if isinstance(v, (int, float))}
    lines += ["", "Scores from the run's results.json:", "", "| metric | value |",
              "|---|---|"] + [f"| {k} | {v:.4g} |" for k, v in shown.items()]
  lines += ["", "```python", "from transformers import MarianMTModel, MarianTokenizer",
            'model = MarianMTModel.from_pretrained(".")',
            'tokenizer = MarianTokenizer.from_pretrained(".")',
            'batch = tokenizer(["..."], return_tensors="pt")',
            "print(tokenizer.batch_decode(model.generate(**batch), "
            "skip_special_tokens=True))", "```", "",
            "To fine-tune it in transformers as it was trained, freeze `embed_positions` "
            "(fixed sinusoids)" + ("" if m.attention_bias else " and the attention "
                                   "projections' biases (zeros: the paper's attention has "
                                   "none)") + ", and set the token embeddings' "
            "`padding_idx` to None (the decoder's start symbol is the padding id and "
            "learns): transformer-jax's docs/interop.md, \"Fine-tuning an export in "
            "transformers\"."]
  if command:
    lines += ["", f"Made by: `{command}`"]
  return "\n".join(lines) + "\n"


def read_folder(path: str) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, Any]]:
  """A MarianMT folder's config.json, weights (safetensors) and tokenizer files:
  (config, tensors, {"source_spm", "target_spm", "vocabulary", "specials",
  "source_lang", "target_lang"}). Anything missing or not MarianMT's: one line."""
  from safetensors.numpy import load_file

  folder = epath.Path(path)
  need = lambda name: _need(folder, name)
  config = json.loads(need("config.json").read_text())
  if config.get("model_type") != "marian":
    raise ValueError(f"{folder / 'config.json'}: model_type={config.get('model_type')!r}; "
                     "import_model reads MarianMT folders (model_type 'marian').")
  if not (folder / WEIGHTS).exists() and (folder / "pytorch_model.bin").exists():
    raise ValueError(f"{folder} holds pytorch_model.bin, not {WEIGHTS}: convert it with "
                     "transformers (MarianMTModel.from_pretrained(DIR).save_pretrained(DIR)).")
  tensors = load_file(os.fspath(need(WEIGHTS)))
  tokenizer_config = (json.loads((folder / "tokenizer_config.json").read_text())
                      if (folder / "tokenizer_config.json").exists() else {})
  if tokenizer_config.get("separate_vocabs") or (folder / "target_vocab.json").exists():
    raise ValueError(f"{folder}: separate source and target vocabularies "
                     "(separate_vocabs); this project's model shares one vocabulary.")
  vocab = json.loads(need("vocab.json").read_text())
  vocabulary = [piece for piece, _ in sorted(vocab.items(), key=lambda item: item[1])]
  if sorted(vocab.values()) != list(range(len(vocab))):
    raise ValueError(f"{folder / 'vocab.json'}: ids are not 0..{len(vocab) - 1}, each once.")
  token = lambda key, default: str(tokenizer_config.get(key) or default)
  specials = [token("pad_token", "<pad>"), token("eos_token", "</s>"),
              token("unk_token", "<unk>")]
  return config, tensors, {
      "source_spm": need("source.spm").read_bytes(),
      "target_spm": need("target.spm").read_bytes(), "vocabulary": vocabulary,
      "specials": specials, "source_lang": tokenizer_config.get("source_lang"),
      "target_lang": tokenizer_config.get("target_lang")}


def _need(folder: epath.Path, name: str) -> epath.Path:
  if not (folder / name).exists():
    raise FileNotFoundError(f"{folder / name} not found: a MarianMT folder holds "
                            f"config.json, {WEIGHTS}, vocab.json, source.spm and target.spm.")
  return folder / name


def model_fields(config: dict[str, Any], tensors: dict[str, np.ndarray]) -> dict[str, Any]:
  """The model.* config fields of this MarianMT model (its config.json and weights);
  what the architecture cannot express raises ValueError naming the field."""
  get = lambda key, default=None: config.get(key, default)

  def same(a: str, b: str):
    if get(a) != get(b):
      raise ValueError(f"config.json: {a}={get(a)} and {b}={get(b)}: this project's "
                       "encoder and decoder layers are one size.")
    return get(a)

  activation = FROM_ACTIVATION.get(get("activation_function", "gelu"))
  if activation is None:
    raise ValueError(f"config.json: activation_function={get('activation_function')!r}: "
                     f"model.activation takes {sorted(FROM_ACTIVATION)}.")
  if not get("scale_embedding", False):
    raise ValueError("config.json: scale_embedding=false: this project's embeddings are "
                     "always scaled by sqrt(d_model) (Sec. 3.4).")
  shared = get("share_encoder_decoder_embeddings", True)
  if shared != get("tie_word_embeddings", True):
    raise ValueError(f"config.json: share_encoder_decoder_embeddings={shared} with "
                     f"tie_word_embeddings={get('tie_word_embeddings', True)}: this project "
                     "ties all three matrices (model.share_embeddings) or none.")
  if get("decoder_vocab_size") not in (None, get("vocab_size")):
    raise ValueError("config.json: decoder_vocab_size differs from vocab_size: this "
                     "project's vocabulary is one for both sides.")
  if get("decoder_start_token_id") != get("pad_token_id"):
    raise ValueError("config.json: decoder_start_token_id differs from pad_token_id: "
                     "this project's decoder starts with the padding id.")
  attention_bias = any(np.any(x) for name, x in tensors.items() if marian.is_attention_bias(name))
  return dict(
      d_model=get("d_model"), num_heads=same("encoder_attention_heads",
                                             "decoder_attention_heads"),
      num_encoder_layers=get("encoder_layers"), num_decoder_layers=get("decoder_layers"),
      d_ff=same("encoder_ffn_dim", "decoder_ffn_dim"), activation=activation,
      max_len=get("max_position_embeddings"), share_embeddings=shared, key_dim=0,
      pre_norm=False, learned_positions=False, attention_bias=bool(attention_bias),
      logits_bias=bool(np.any(tensors.get("final_logits_bias", 0))),
      layer_norm_epsilon=MARIAN_EPSILON, vocab_multiple=1,
      dropout_rate=float(get("dropout", 0.1)),
      attention_dropout_rate=float(get("attention_dropout", 0.0)),
      relu_dropout_rate=float(get("activation_dropout", 0.0)))


def translate_huggingface(folder: str, sources: list[str], beam_size: int | None = None,
                          length_penalty: float | None = None, batch_size: int = 32,
                          max_extra_length: int | None = None) -> list[str]:
  """`sources` translated by transformers (PyTorch, CPU) with the MarianMT folder's own
  generation_config.json (or this beam and transformers' |Y|^a length penalty), in
  batches of similar length; what a user of the export gets (`evaluate --huggingface`).
  With `max_extra_length`, each output's limit is its source's length plus that, as
  this project's search limits it (batches then hold sources of one length)."""
  try:
    with stop_policy.stops_held():
      import torch
      import transformers
  except ImportError:
    raise ValueError("transformers and PyTorch are not installed: pip install -e "
                     "'.[huggingface]'") from None
  model = transformers.MarianMTModel.from_pretrained(folder).eval()
  tokenizer = transformers.MarianTokenizer.from_pretrained(folder)
  settings = {k: v for k, v in (("num_beams", beam_size), ("length_penalty", length_penalty))
              if v is not None}
  lengths = [len(ids) for ids in tokenizer(sources)["input_ids"]]
  order = sorted(range(len(sources)), key=lambda i: lengths[i])
  batches = [order[start:start + batch_size] for start in range(0, len(order), batch_size)]
  if max_extra_length is not None:
    batches = [[i for i in batch if lengths[i] == n] for batch in batches
               for n in sorted({lengths[i] for i in batch})]
  outputs = [""] * len(sources)
  with torch.no_grad():
    for rows in batches:
      batch = tokenizer([sources[i] for i in rows], return_tensors="pt", padding=True)
      limit = {} if max_extra_length is None else {
          "max_length": 1 + lengths[rows[0]] + max_extra_length}
      generated = model.generate(**batch, **settings, **limit)
      for i, text in zip(rows, tokenizer.batch_decode(generated, skip_special_tokens=True)):
        outputs[i] = text
  return outputs
