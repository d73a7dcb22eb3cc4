r"""Bring a Hugging Face MarianMT model (an OPUS-MT model, or this project's own export)
in as a run: a new workdir with its config, tokenizer and one checkpoint (step 0).

  python -m transformer_jax.import_model --from=huggingface --path=opus-mt-en-de \
      --workdir=runs/opus_en_de [--config=configs/transformer.py:multi30k]

The model's fields come from the folder (with the options it needs: model.activation,
model.attention_bias, model.logits_bias, model.layer_norm_epsilon, and its tokenizer as
data.tokenizer_type="marian"); everything else (the data to fine-tune on, the schedule,
decoding) from --config (default: the paper's base settings). Then translate, evaluate,
score and export take --workdir=RUN as for any run, and training goes on from the
imported weights with the run's own config:

  python -m transformer_jax.main --config=configs/workdir.py:runs/opus_en_de \
      --workdir=runs/opus_en_de --config.train.num_train_steps=2000

Nothing is downloaded: the folder is a local copy (transformers' save_pretrained, or
huggingface_hub's snapshot_download, writes one). The workdir is written whole or not
at all, and must not exist yet.
"""

from __future__ import annotations

import logging
import shutil

import jax
import ml_collections
import orbax.checkpoint as ocp
from absl import flags
from etils import epath
from ml_collections import config_flags

from transformer_jax import checkpoint, cli, config as config_lib, files, partitioning
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.inference import huggingface, marian
from transformer_jax.model.transformer import Transformer
from transformer_jax.training import optimizer, step

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import)."""
  flags.DEFINE_enum("from", "huggingface", ["huggingface"], "The format of --path: a "
                    "Hugging Face MarianMT folder (config.json, model.safetensors, "
                    "vocab.json, source.spm, target.spm).")
  flags.DEFINE_string("path", None, "The model's folder.", required=True)
  flags.DEFINE_string("workdir", None, "The run to create (must not exist).", required=True)
  config_flags.DEFINE_config_file(
      "config", None, "The run's other settings (data, training, decoding): a config "
      "file such as configs/transformer.py:multi30k, with --config.section.field "
      "overrides; default: the paper's base settings.", lock_config=False)


def import_huggingface(path: str, workdir: str,
                       config: ml_collections.ConfigDict | None = None) -> config_lib.Config:
  """Writes `workdir` (new) as a run of the MarianMT model in folder `path`: config.json,
  tokenizer.model and checkpoint 0 (the weights, Adam's moments at zero). Returns its
  config."""
  target = epath.Path(workdir)
  if target.exists() and any(target.iterdir()):
    raise ValueError(f"--workdir={workdir} exists and is not empty: import_model writes a "
                     "new run; choose another workdir.")
  marian_config, tensors, tok_files = huggingface.read_folder(path)
  config = ml_collections.ConfigDict(
      (config or config_lib.defaults()).to_dict())  # Unlocked, so fields may be set.
  config.model.update(huggingface.model_fields(marian_config, tensors))
  config.data.update(tokenizer_type="marian", pretokenize="", tokenizer_file="",
                     vocab_size=len(tok_files["vocabulary"]))
  for side in ("source_lang", "target_lang"):
    if tok_files[side]:
      config.data[side] = tok_files[side]
  longest = config.model.max_len - config.decode.max_extra_length
  if config.data.max_length > longest:  # The model has positions for no more.
    logging.info("data.max_length %d -> %d: the model's %d positions hold a sentence that "
                 "long plus decode.max_extra_length=%d", config.data.max_length, longest,
                 config.model.max_len, config.decode.max_extra_length)
    config.data.max_length = longest
  cfg = config_lib.parse(config)

  staging = files.staging_dir(target)
  try:
    tok = tokenizer_lib.write_marian(staging / "tokenizer.model", tok_files["source_spm"],
                                     tok_files["target_spm"], tok_files["vocabulary"],
                                     tok_files["specials"])
    _check_ids(marian_config, tok)
    cfg = config_lib.with_vocab(cfg, tok.vocab_size)
    params = marian.params_from_marian(tensors, cfg.model, tok.marian_ids)
    _save_step_0(cfg, params, str(staging))
    files.write_atomic(staging / "config.json", config.to_json_best_effort(
        indent=2, sort_keys=True))
    if target.exists():
      target.rmdir()  # Empty (checked above).
    files.replace_dir(staging, target)
  finally:
    if staging.exists():
      shutil.rmtree(staging)
  return cfg


def _check_ids(marian_config: dict, tok: tokenizer_lib.Marian) -> None:
  """The model's padding and EOS ids are its tokenizer's."""
  pad, eos = tok.marian_ids[config_lib.PAD_ID], tok.marian_ids[config_lib.EOS_ID]
  for key, expected in (("pad_token_id", pad), ("eos_token_id", eos)):
    if marian_config.get(key) != expected:
      raise ValueError(f"config.json: {key}={marian_config.get(key)}, but vocab.json gives "
                       f"{tok.marian_vocabulary[expected]!r} id {expected}.")


def _save_step_0(cfg: config_lib.Config, params, workdir: str) -> None:
  """Checkpoint 0 of a run starting from `params`: a fresh train state (Adam's moments
  zero, step 0) holding them, as training saves it."""
  mesh = partitioning.make_mesh((1,) * len(config_lib.MESH_AXES), jax.devices()[:1])
  tx, _ = optimizer.make_optimizer(cfg.optimizer, cfg.model.d_model)
  state, _ = step.create_train_state(Transformer(cfg.model), tx, mesh, jax.random.key(0),
                                     cfg.train.logical_axis_rules)
  fresh = state.params
  if jax.tree.structure(fresh) != jax.tree.structure(params):
    raise ValueError("the imported weights do not make this model's parameters "
                     f"({jax.tree.structure(params)} against {jax.tree.structure(fresh)})")
  state = state.replace(params=jax.tree.map(
      lambda old, new: jax.device_put(new.astype(old.dtype), old.sharding), fresh, params))
  mngr = checkpoint.manager(workdir, cfg.train.keep_checkpoints)
  mngr.save(0, args=ocp.args.StandardSave(state), force=True)
  mngr.wait_until_finished()
  mngr.close()


def main():
  logging.getLogger().setLevel(logging.INFO)
  try:
    cfg = import_huggingface(FLAGS.path, FLAGS.workdir, FLAGS.config)
  except (FileNotFoundError, ValueError) as e:
    cli.fail(str(e))
  m = cfg.model
  print(f"Imported {FLAGS.path} as {FLAGS.workdir}: {m.num_encoder_layers}+"
        f"{m.num_decoder_layers} layers, d_model {m.d_model}, vocabulary {m.vocab_size}, "
        f"activation {m.activation}. Translate: python -m transformer_jax.translate "
        f"--workdir={FLAGS.workdir}; fine-tune: python -m transformer_jax.main "
        f"--config=configs/workdir.py:{FLAGS.workdir} --workdir={FLAGS.workdir}")


if __name__ == "__main__":
  define_flags()
  cli.run(main, stopped="before the import was complete: --workdir was not written (a "
          "folder already there is kept as it was).")
