"""The configs (transformer_jax/config/, configs/): the paper's values, overrides from the
command line, and bad values answered in one line."""

import dataclasses
import os

import pytest

from configs import transformer as transformer_configs
from transformer_jax import config as config_lib


def test_base_is_exactly_the_defaults():
  """One source for every default: `:base` changes nothing in config.py's dataclasses
  but the row of Table 2 its final test line names."""
  base = config_lib.parse(transformer_configs.get_config("base"))
  assert base.train.paper_row == "base"
  assert dataclasses.replace(base, train=dataclasses.replace(base.train, paper_row="")) \
      == config_lib.Config()


ALL_CONFIGS = [*transformer_configs.SIZES, *(f"{s},smoke" for s in transformer_configs.SIZES)]


@pytest.mark.parametrize("size", ALL_CONFIGS)
def test_every_shipped_config_parses(size):
  cfg = config_lib.parse(transformer_configs.get_config(size))
  assert isinstance(cfg.model, config_lib.ModelConfig) and cfg.model.vocab_size == 0
  assert config_lib.with_vocab(cfg, 100).model.vocab_size == 100


@pytest.mark.parametrize("size", ALL_CONFIGS)
def test_every_config_field_can_be_overridden_from_the_command_line(size):
  """config_flags only overrides fields the ConfigDict has: each must list them all."""
  config = transformer_configs.get_config(size)
  for section, cls in (("model", config_lib.ModelConfig), ("optimizer",
                       config_lib.OptimizerConfig), ("decode", config_lib.DecodeConfig),
                       ("train", config_lib.TrainConfig), ("data", config_lib.DataConfig)):
    fields = {f.name for f in dataclasses.fields(cls)} - ({"vocab_size"} if section == "model" else set())
    assert set(config[section]) == fields, section
  with pytest.raises(ValueError, match="Unknown field.*config.model.vocab_size"):
    config_lib.parse({"model": {"vocab_size": 100}})


def test_base_and_big_match_the_paper():
  """Table 3: base and big sizes, dropout, label smoothing, steps."""
  base = config_lib.parse(transformer_configs.get_config("base"))
  big = config_lib.parse(transformer_configs.get_config("big"))
  b, g = base.model, big.model
  assert (b.num_encoder_layers, b.d_model, b.d_ff, b.num_heads, b.head_dim,
          b.dropout_rate) == (6, 512, 2048, 8, 64, 0.1)
  assert (g.num_encoder_layers, g.d_model, g.d_ff, g.num_heads, g.head_dim,
          g.dropout_rate) == (6, 1024, 4096, 16, 64, 0.3)
  assert base.train.num_train_steps == 100_000 and big.train.num_train_steps == 300_000
  assert base.train.label_smoothing == big.train.label_smoothing == 0.1
  assert (base.decode.beam_size, base.decode.length_penalty,
          base.decode.max_extra_length) == (4, 0.6, 50)
  assert not b.pre_norm and b.share_embeddings and not b.learned_positions
  assert (base.data.tfds_name, base.data.vocab_size) == ("wmt14_translate/de-en:1.0.0", 37_000)
  assert (base.train.checkpoint_every_steps, base.train.keep_checkpoints) == (1500, 5)
  assert big.train.keep_checkpoints == 20  # Last 20 averaged for big (Sec. 6.1).
  # Sec. 6.1: "a single model obtained by averaging the last 5 checkpoints" (base), 20
  # (big): what the final evaluation translates with.
  assert (base.train.average_last, big.train.average_last) == (5, 20)
  # Sec. 5.1: "approximately 25000 source tokens and 25000 target tokens", real ones.
  for cfg in (base, big):
    assert (cfg.train.batching, cfg.train.batch_tokens, cfg.train.batch_tokens_count) == (
        "tokens", 25_000, "real")
  # Table 2: scored on newstest2014 at the end, beside the paper's row.
  assert (base.train.final_test, base.train.paper_row, big.train.paper_row) == (
      True, "base", "big")


def test_en_fr_configs_match_the_paper():
  """Sec. 5.1, 6.1: EN-FR uses 32k word pieces and P_drop 0.1 for big."""
  base = config_lib.parse(transformer_configs.get_config("base_enfr"))
  big = config_lib.parse(transformer_configs.get_config("big_enfr"))
  for cfg in (base, big):
    assert (cfg.data.tfds_name, cfg.data.source_lang, cfg.data.target_lang) == (
        "wmt14_translate/fr-en:1.0.0", "en", "fr")
    assert (cfg.data.vocab_size, cfg.data.tokenizer_type) == (32_000, "unigram")
  assert big.model.dropout_rate == 0.1 and big.model.d_model == 1024
  assert base.model.d_model == 512


def test_a_smoke_configs_cadences_follow_an_overridden_step_count():
  """`,smoke` is 20 steps, logged every 5, evaluated and checkpointed every 10; with
  more steps, as often relative to its length, and at least every step with fewer; each
  still overridable."""
  c = transformer_configs.get_config("numbers,smoke")
  cadences = lambda t: (t.log_every_steps, t.eval_every_steps, t.checkpoint_every_steps)
  assert cadences(config_lib.parse(c).train) == (5, 10, 10)
  c.train.num_train_steps = 2000
  assert cadences(config_lib.parse(c).train) == (500, 1000, 1000)
  c.train.log_every_steps = 50
  assert cadences(config_lib.parse(c).train) == (50, 1000, 1000)
  for steps, expected in ((1, (1, 1, 1)), (2, (1, 1, 1)), (6, (2, 3, 3))):
    c = transformer_configs.get_config("numbers,smoke")
    c.train.num_train_steps = steps
    assert cadences(config_lib.parse(c).train) == expected


def test_the_multi30k_recipe_is_the_transformer_tiny_of_wu_et_al():
  """Wu et al. (2021): 4+4 layers, d_model 128, FFN 256, 4 heads, beam 5; dropout 0.1
  and the rest chosen on val (experiments/multi30k_recipe.py)."""
  cfg = config_lib.parse(transformer_configs.get_config("multi30k"))
  m = cfg.model
  assert (m.num_encoder_layers, m.num_decoder_layers, m.d_model, m.d_ff, m.num_heads,
          m.dropout_rate) == (4, 4, 128, 256, 4, 0.1)
  assert (cfg.decode.beam_size, cfg.train.keep_checkpoints, cfg.train.keep_best_by) == (
      5, 10, "eval/bleu")


def test_the_wu2021_config_is_their_fairseq_recipe():
  """multi30k_wu2021: Wu et al. (2021)'s train.py flags (transformer_tiny, dropout 0.3,
  --lr 0.005, --warmup-updates 2000, --max-tokens 4096 on 2 GPUs, --max-update 8000,
  --patience 10) and their fairseq fork's defaults (adam (0.9, 0.98) 1e-8, inverse_sqrt
  from 1e-7, --clip-norm 25, label smoothing 0.1, validation and a checkpoint every
  epoch, --beam 5 with --lenpen 1), on their lowercased Moses tokens and subword-nmt's
  joint BPE of 10,000 merges (their data/multi30k-en-de/code)."""
  cfg = config_lib.parse(transformer_configs.get_config("multi30k_wu2021"))
  m, o, t, d = cfg.model, cfg.optimizer, cfg.train, cfg.decode
  assert (m.num_encoder_layers, m.num_decoder_layers, m.d_model, m.d_ff, m.num_heads,
          m.dropout_rate, m.attention_dropout_rate, m.relu_dropout_rate, m.pre_norm,
          m.share_embeddings, m.qkv_init_scale) == (
              4, 4, 128, 256, 4, 0.3, 0.0, 0.0, False, True, 0.5)
  assert (o.schedule, o.peak_learning_rate, o.warmup_init_lr, o.warmup_steps, o.beta1,
          o.beta2, o.epsilon, o.grad_clip_norm) == (
              "fairseq", 0.005, 1e-7, 2000, 0.9, 0.98, 1e-8, 25.0)
  assert (t.batch_tokens, t.num_train_steps, t.label_smoothing, t.eval_every_epochs,
          t.checkpoint_every_epochs, t.keep_best_by, t.early_stop_patience,
          t.keep_checkpoints) == (8192, 8000, 0.1, 1, 1, "eval/loss", 10, 11)
  assert t.num_eval_batches * t.batch_size >= 1014  # All of val, as fairseq validates.
  assert (d.beam_size, d.length_penalty, d.length_penalty_form) == (5, 1.0, "fairseq")
  assert (cfg.data.task, cfg.data.pretokenize, cfg.data.tokenizer_type,
          cfg.data.vocab_size) == ("multi30k", "moses_lowercase", "subword_nmt", 10_000)


def test_unknown_config_names_fail_listing_the_valid_ones():
  with pytest.raises(ValueError, match="one of numbers, multi30k, multi30k_wu2021, base"):
    transformer_configs.get_config("huge")


@pytest.mark.parametrize("section,field,value,message", [
    ("model", "d_model", 100, "config.model.d_model=100 is invalid: expected a multiple of "
                              "model.num_heads=8"),
    ("model", "dropout_rate", -0.1, "config.model.dropout_rate=-0.1"),
    ("optimizer", "warmup_steps", 0, "config.optimizer.warmup_steps=0"),
    ("model", "dtype", "float16", "one of ('float32', 'bfloat16')"),
    ("train", "average_last", 0, "config.train.average_last=0 is invalid: expected >= 1"),
    ("train", "loss_kernel", "triton", "config.train.loss_kernel='triton' is invalid: "
                                       "expected one of ('xla', 'pallas', 'hybrid')"),
    ("model", "norm_kernel", "apex", "config.model.norm_kernel='apex' is invalid: "
                                     "expected one of ('xla', 'pallas')"),
    ("model", "ffn_kernel", "cublas", "config.model.ffn_kernel='cublas' is invalid: "
                                      "expected one of ('xla', 'pallas')"),
    ("train", "batch_tokens_count", "tokens", "config.train.batch_tokens_count='tokens' is "
                                              "invalid: expected one of ('real', 'padded')"),
])
def test_invalid_values_fail_naming_the_field(section, field, value, message):
  """One line naming the field, the value and what would be valid."""
  config = transformer_configs.get_config("base")
  config[section][field] = value
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
    config_lib.parse(config)
  assert len(str(e.value).splitlines()) == 1


@pytest.mark.parametrize("kernel,section,field,value", [
    ("train.loss_kernel", "train", "loss_chunk_length", 16),
    ("train.loss_kernel=hybrid", "train", "loss_chunk_length", 16),
    ("train.loss_kernel", "model", "logits_bias", True),
    ("model.norm_kernel", "model", "pre_norm", True),
    ("model.ffn_kernel", "model", "activation", "gelu"),
    ("model.ffn_kernel", "model", "relu_dropout_rate", 0.1)])
def test_the_kernels_refuse_what_they_do_not_compute(kernel, section, field, value):
  """train.loss_kernel="pallas" (and "hybrid") computes the whole loss at once, from the
  output embedding alone: chunks and a logits bias are refused; model.norm_kernel="pallas"
  fuses the post-norm residual: pre-norm is refused; model.ffn_kernel="pallas" fuses
  ReLU's gradient alone: another activation or dropout after it is refused. One line
  naming both fields."""
  config = transformer_configs.get_config("base")
  kernel, _, choice = kernel.partition("=")
  kernel_section, kernel_field = kernel.split(".")
  config[kernel_section][kernel_field], config[section][field] = choice or "pallas", value
  with pytest.raises(ValueError, match=f"config.{kernel}='{choice or 'pallas'}' is invalid: "
                                       f"expected .*{section}.{field}"):
    config_lib.parse(config)


def test_misspelt_sections_and_fields_get_a_suggestion():
  with pytest.raises(ValueError, match='config.model.num_head \\(did you mean "num_heads"'):
    config_lib.parse({"model": {"num_head": 4}})
  with pytest.raises(ValueError, match='modle \\(did you mean "model"'):
    config_lib.parse({"modle": {"d_model": 64}})


def test_unknown_fields_fail_naming_the_field():
  config = transformer_configs.get_config("base").to_dict()
  config["model"]["num_head"] = 8
  with pytest.raises(ValueError, match=r"config\.model\.num_head.*valid fields of config\.model:.*num_heads"):
    config_lib.parse(config)


def test_the_config_field_reference_is_current_and_complete():
  """docs/config.md is what `python -m transformer_jax.config` writes, and every field
  there has a meaning (config.field's doc)."""
  from conftest import ROOT
  text = config_lib.field_reference()
  with open(os.path.join(ROOT, "docs", "config.md"), encoding="utf-8") as f:
    assert f.read() == text, "docs/config.md is stale: python -m transformer_jax.config"
  rows = [line for line in text.splitlines() if line.startswith("| `")]
  assert len(rows) == sum(len(dataclasses.fields(f.default_factory))
                          for f in dataclasses.fields(config_lib.Config)) - 1  # vocab_size
  assert all(not row.endswith("|  |") for row in rows), [r for r in rows if r.endswith("|  |")]
