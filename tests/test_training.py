"""Optimizer, loss, configuration, input pipeline and the training loop."""

import dataclasses
import json
import importlib.util
import math
import os
import select
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from configs import transformer as transformer_configs
from conftest import toy_data
from launch import results
from transformer_jax import config as config_lib, evaluate, partitioning
from transformer_jax.data import batching, number_words
from transformer_jax.inference import restore
from transformer_jax import checkpoint
from transformer_jax.model import losses
from transformer_jax.training import early_stopping, loop, metrics
from transformer_jax.training import compilation, optimizer, run as run_lib


def test_schedule_has_the_papers_values():
  """Sec. 5.3: lrate = d^-0.5 * min(step^-0.5, step * warmup^-1.5), warmup 4000."""
  d, warmup = 512, 4000
  lr = optimizer.inverse_sqrt_schedule(d, warmup)
  at = lambda step: float(lr(step - 1))  # optax counts updates from 0; the paper from 1.
  np.testing.assert_allclose(at(1), d**-0.5 * warmup**-1.5, rtol=1e-5)
  np.testing.assert_allclose(at(warmup), d**-0.5 * warmup**-0.5, rtol=1e-5)
  np.testing.assert_allclose(at(4 * warmup), d**-0.5 * (4 * warmup)**-0.5, rtol=1e-5)
  assert at(warmup) > at(warmup - 100) and at(warmup) > at(warmup + 100)  # The peak.
  np.testing.assert_allclose(float(optimizer.inverse_sqrt_schedule(d, warmup, 2.0)(0)),
                             2 * at(1), rtol=1e-5)


def test_the_fairseq_schedule_has_fairseqs_values():
  """optimizer.schedule="fairseq", as fairseq's inverse_square_root_schedule.py steps it
  (Wu et al. 2021's recipe: --lr 0.005 --warmup-updates 2000, --warmup-init-lr 1e-7 by
  default): the update after n updates uses 1e-7 + n (0.005 - 1e-7) / 2000 during
  warmup, then 0.005 sqrt(2000 / n); and the config picks it."""
  lr = optimizer.fairseq_inverse_sqrt_schedule(0.005, 2000, 1e-7)
  for n, expected in ((0, 1e-7), (1, 1e-7 + (0.005 - 1e-7) / 2000),
                      (1999, 1e-7 + 1999 * (0.005 - 1e-7) / 2000), (2000, 0.005),
                      (8000, 0.005 * 0.5)):
    np.testing.assert_allclose(float(lr(n)), expected, rtol=1e-5)
  cfg = config_lib.OptimizerConfig(schedule="fairseq", peak_learning_rate=0.005,
                                   warmup_steps=2000)
  np.testing.assert_allclose(float(optimizer.make_optimizer(cfg, 128)[1](8000)), 0.0025,
                             rtol=1e-5)
  with pytest.raises(config_lib.InputError, match="optimizer.schedule='fair'"):
    config_lib.OptimizerConfig(schedule="fair")


def test_label_smoothed_loss_matches_a_hand_computation():
  """Sec. 5.4, eps = 0.1: target distribution (1 - eps) * one_hot + eps / V, over all V
  tokens (Szegedy et al.'s uniform prior), not the V - 1 others: the target's logit
  (0.5) is not the mean logit (1.0), so the two differ."""
  logits = jnp.array([[[2.5, 0.5, 0.0], [0.0, 1.0, 3.0]]])
  targets = jnp.array([[1, 0]])  # The second position is padding.
  sums = losses.token_metrics(logits, targets, label_smoothing=0.1)
  z = np.array([2.5, 0.5, 0.0])
  log_p = z - math.log(np.exp(z).sum())
  q = np.array([0.1 / 3, 0.9 + 0.1 / 3, 0.1 / 3])
  np.testing.assert_allclose(float(sums["loss"]), -(q * log_p).sum(), rtol=1e-6)
  np.testing.assert_allclose(float(sums["nll"]), -log_p[1], rtol=1e-6)
  assert float(sums["tokens"]) == 1.0 and float(sums["correct"]) == 0.0
  summary = metrics.summary(metrics.EvalMetrics.from_sums(sums))
  np.testing.assert_allclose(summary["perplexity"], math.exp(-log_p[1]), rtol=1e-5)


def _reference_metrics(logits, targets, eps):
  """The textbook form: two log-softmaxes over float32 logits and an argmax (optax)."""
  import optax
  logits = logits.astype(jnp.float32)
  weights = (targets != 0).astype(jnp.float32)
  smoothed = optax.smooth_labels(jax.nn.one_hot(targets, logits.shape[-1]), eps)
  return {"loss": jnp.sum(optax.softmax_cross_entropy(logits, smoothed) * weights),
          "nll": jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, targets)
                         * weights),
          "correct": jnp.sum((jnp.argmax(logits, -1) == targets) * weights),
          "tokens": jnp.sum(weights)}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_one_pass_loss_equals_the_textbook_form_and_its_gradient(dtype):
  """Sec. 5.4's smoothed loss, the nll and the accuracy from one log-sum-exp over logits
  kept in the compute dtype equal optax's two-pass float32 form, values and gradients."""
  logits = (3 * jax.random.normal(jax.random.key(0), (4, 9, 50))).astype(dtype)
  targets = jax.random.randint(jax.random.key(1), (4, 9), 0, 50)
  got, expected = (f(logits, targets, 0.1) for f in (losses.token_metrics,
                                                     _reference_metrics))
  for k in losses.METRICS:
    np.testing.assert_allclose(got[k], expected[k], rtol=1e-5)
  grad = lambda f: jax.grad(lambda z: f(z, targets, 0.1)["loss"])(logits.astype(jnp.float32))
  np.testing.assert_allclose(grad(losses.token_metrics), grad(_reference_metrics), atol=1e-6)


@pytest.mark.parametrize("chunk", [1, 4, 9, 32])
def test_chunked_loss_equals_the_whole_loss_and_its_gradient(chunk):
  """train.loss_chunk_length: the projection and loss chunk by chunk over positions
  (the last chunk padded) give the same sums and gradients as all at once."""
  states = jax.random.normal(jax.random.key(0), (3, 9, 16))
  kernel = jax.random.normal(jax.random.key(1), (16, 40))
  targets = jax.random.randint(jax.random.key(2), (3, 9), 0, 40).at[2, 5:].set(0)
  def sums(states, kernel, chunked):
    project = lambda y: y @ kernel
    if chunked:
      return losses.chunked_token_metrics(project, states, targets, 0.1, chunk)
    return losses.token_metrics(project(states), targets, 0.1)
  for k in losses.METRICS:
    np.testing.assert_allclose(sums(states, kernel, True)[k],
                               sums(states, kernel, False)[k], rtol=1e-5)
  grads = [jax.grad(lambda s, w: sums(s, w, chunked)["loss"], argnums=(0, 1))(states, kernel)
           for chunked in (True, False)]
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), *grads)


@pytest.mark.parametrize("size", ["base", "big", "base_enfr", "big_enfr"])
def test_paper_configs_use_the_papers_adam(size):
  """Sec. 5.3: Adam with beta1 0.9, beta2 0.98, epsilon 1e-9, warmup 4000, no clipping."""
  opt = config_lib.parse(transformer_configs.get_config(size)).optimizer
  assert (opt.beta1, opt.beta2, opt.epsilon, opt.warmup_steps, opt.learning_rate_multiplier,
          opt.grad_clip_norm) == (0.9, 0.98, 1e-9, 4000, 1.0, 0.0)


def test_base_is_exactly_the_defaults():
  """One source for every default: `:base` changes nothing in config.py's dataclasses."""
  assert config_lib.parse(transformer_configs.get_config("base")) == config_lib.Config()


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
  assert (base.data.tfds_name, base.data.vocab_size) == ("wmt14_translate/de-en", 37_000)
  assert (base.train.checkpoint_every_steps, base.train.keep_checkpoints) == (1500, 5)
  assert big.train.keep_checkpoints == 20  # Last 20 averaged for big (Sec. 6.1).


def test_en_fr_configs_match_the_paper():
  """Sec. 5.1, 6.1: EN-FR uses 32k word pieces and P_drop 0.1 for big."""
  base = config_lib.parse(transformer_configs.get_config("base_enfr"))
  big = config_lib.parse(transformer_configs.get_config("big_enfr"))
  for cfg in (base, big):
    assert (cfg.data.tfds_name, cfg.data.source_lang, cfg.data.target_lang) == (
        "wmt14_translate/fr-en", "en", "fr")
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
])
def test_invalid_values_fail_naming_the_field(section, field, value, message):
  config = transformer_configs.get_config("base")
  config[section][field] = value
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
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


def test_german_number_words():
  assert number_words.german(34) == "vierunddreißig"
  assert number_words.german(1) == "eins" and number_words.german(21) == "einundzwanzig"
  assert number_words.german(101001) == "einhunderteintausendeins"
  assert number_words.german(17) == "siebzehn" and number_words.german(60) == "sechzig"
  assert number_words.english(34) == "thirty-four"
  assert number_words.english(101001) == "one hundred one thousand one"


def test_held_out_numbers_never_appear_in_training():
  held_out = {number_words.german(int(n)) for n in number_words.held_out_numbers(200)}
  _, train_de = number_words.make_split("train", 5000, 200)
  seen = {word for line in train_de for word in line.replace(",", "").split()}
  assert not held_out & seen
  test_en, test_de = number_words.make_split("test", 50, 200)
  assert all(w in held_out for line in test_de for w in line.replace(",", "").split()
             if w != "und")


def test_token_budget_batches_cover_an_epoch_once_with_bounded_shapes():
  data = toy_data(50)
  grouped, lengths, starts, stops = batching._token_budget_epoch(data, 256, 8, 3, 0)
  seen = np.concatenate([grouped[a:b] for a, b in zip(starts, stops)])
  assert sorted(seen.tolist()) == list(range(len(data)))
  assert set(lengths.tolist()) <= {8, 16, 24, 32}
  for length, a, b in zip(lengths, starts, stops):  # Each pair fits its batch's length.
    assert data.longer_side()[grouped[a:b]].max() <= length


def test_epoch_cadences_are_the_steps_of_one_pass_over_the_training_pairs():
  """train.eval_every_epochs and checkpoint_every_epochs (fairseq's --validate-interval
  and --save-interval, for its recipes): an epoch is as many steps as the token-budget
  batches that cover the training pairs once."""
  data = toy_data(50)
  config = transformer_configs.get_config("numbers,smoke")
  config.train.update(batch_tokens=256, max_length_buckets=8, eval_every_epochs=1,
                      checkpoint_every_epochs=3)
  cfg = config_lib.parse(config)
  _, _, starts, _ = batching._token_budget_epoch(data, 256, 8, cfg.train.seed, 0)
  epoch = batching.steps_per_epoch(data, cfg.train)
  assert epoch == len(starts) > 1
  task = types.SimpleNamespace(train=data, tokenizer=types.SimpleNamespace(vocab_size=37))
  train = loop._with_task(cfg, task).train
  assert (train.eval_every_steps, train.checkpoint_every_steps) == (epoch, 3 * epoch)
  config.train.update(eval_every_epochs=0)  # Steps, as before, where an epoch field is 0.
  assert loop._with_task(config_lib.parse(config), task).train.eval_every_steps == 10
  config.train.update(batching="sentences")  # No fixed number of steps an epoch.
  with pytest.raises(ValueError, match='train.checkpoint_every_epochs=3 is invalid.*"tokens"'):
    config_lib.parse(config)


def _tiny_config(steps):
  config = transformer_configs.get_config("numbers,smoke")
  config.model.update(num_encoder_layers=1, num_decoder_layers=1)  # Learns fast enough.
  config.optimizer.warmup_steps = 20
  config.data.update(num_eval_examples=16, max_length=32)
  # Eight length buckets, as the chunked-loss bound below was measured with (padding
  # changes how far Adam carries rounding over 40 steps).
  config.train.update(num_train_steps=steps, batch_tokens=512, log_every_steps=10,
                      eval_every_steps=20, checkpoint_every_steps=20, max_length_buckets=8)
  config.decode.batch_size = 16
  config.train.mesh_shape = (-1, 1, 1)  # All 8 simulated devices, data parallel.
  return config


@pytest.mark.slow
def test_the_best_checkpoint_is_kept_and_the_run_stops_when_it_stops_improving(tmp_path):
  """train.keep_best_by and train.early_stop_patience. Steps 5-13 are skipped as
  non-finite, so the parameters after steps 4, 6 and 8 are one and the same: the eval
  losses at 6 and 8 do not improve on step 4's, and patience 2 stops the run at 8."""
  config = _tiny_config(20)
  config.train.update(eval_every_steps=2, keep_best_by="eval/loss", early_stop_patience=2,
                      inject_nonfinite_at=tuple(range(5, 14)))
  workdir = str(tmp_path / "run")
  scores = loop.train_and_evaluate(config, workdir)
  assert scores["step"] == 8 and scores["best"]["stopped_at"] == 8, scores
  assert scores["best"]["step"] in (2, 4), scores
  with open(os.path.join(workdir, "results.json")) as f:  # Finished, for the launcher.
    assert json.load(f)["best"]["stopped_at"] == 8
  trained = restore.load_workdir(workdir)
  best, step = restore.restore_params(trained, "best")
  latest, _ = restore.restore_params(trained)
  kept = checkpoint.manager(workdir, 1, read_only=True)
  assert step == scores["best"]["step"] and kept.metrics(step)["eval/loss"] == \
      scores["best"]["value"]  # One of the checkpoints, saved with its metric.
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(best), jax.device_get(latest))
  again = loop.train_and_evaluate(config, workdir)  # Stopped early: trains no further.
  assert again["step"] == 8 and again["history"] == []


def test_keep_best_by_bleu_keeps_the_highest(tmp_path):
  """train.keep_best_by="eval/bleu" (the Multi30k recipe's): BLEU improves upwards, so
  the checkpoint kept is that of the highest BLEU, and evaluations below it count
  towards the patience."""
  cfg = dataclasses.replace(config_lib.parse(transformer_configs.get_config(
      "numbers,smoke")).train, keep_best_by="eval/bleu", bleu_every_steps=2,
      early_stop_patience=2)
  tracker = early_stopping.Best(cfg, str(tmp_path))
  manager = checkpoint.manager(str(tmp_path), 1, keep_best_by=cfg.keep_best_by)
  stops = []
  for step, bleu in ((2, 10.0), (4, 30.0), (6, 20.0), (8, 25.0)):  # Saved every time.
    stops.append(tracker.update(step, {"eval/bleu": bleu, "eval/loss": 1.0}))
    manager.save(step, args=ocp.args.StandardSave({"step": jnp.array(step)}),
                 metrics=tracker.metrics(step))
  manager.wait_until_finished()
  assert stops == [False, False, False, True]
  assert (tracker.record["step"], tracker.record["value"]) == (4, 30.0)
  assert manager.all_steps() == [4, 8]  # The best, and the last train.keep_checkpoints.
  mngr, best = checkpoint.best_step(str(tmp_path), "eval/bleu")
  assert best == 4 and int(mngr.restore(4)["step"]) == 4


@pytest.mark.parametrize("metric, values", [
    ("eval/loss", (3.0, 3.5, 2.0, 2.5, 2.8, 2.9)),
    ("eval/bleu", (10.0, 9.0, 20.0, 15.0, 12.0, 11.0)),
])
def test_the_patience_counts_from_the_last_improvement(tmp_path, metric, values):
  """early_stop_patience=3: one evaluation no better, an improvement (the count starts
  again), then three no better: the run stops at the sixth, not the fourth."""
  cfg = dataclasses.replace(config_lib.parse(transformer_configs.get_config(
      "numbers,smoke")).train, keep_best_by=metric, early_stop_patience=3,
      bleu_every_steps=2)
  tracker = early_stopping.Best(cfg, str(tmp_path))
  stops = [tracker.update(2 * (i + 1), {metric: v}) for i, v in enumerate(values)]
  assert stops == [False, False, False, False, False, True]
  assert (tracker.record["step"], tracker.record["stopped_at"]) == (6, 12)


def test_a_best_checkpoint_kept_in_best_by_an_earlier_version_is_still_read(tmp_path):
  """A workdir whose best checkpoint is in WORKDIR/best/<step> with best/best.json (the
  layout before the best joined checkpoints/): --step=best reads it and the record goes
  on, until a better value is saved among the checkpoints."""
  earlier = ocp.CheckpointManager(tmp_path / "best",
                                  options=ocp.CheckpointManagerOptions(max_to_keep=1))
  earlier.save(4, args=ocp.args.StandardSave({"step": jnp.array(4)}))
  earlier.wait_until_finished()
  (tmp_path / "best" / "best.json").write_text(json.dumps(
      {"metric": "eval/bleu", "value": 30.0, "step": 4, "since": 0, "stopped_at": None,
       "evaluated_at": 4}))
  mngr, step = checkpoint.best_step(str(tmp_path), "eval/bleu")
  assert (step, int(mngr.restore(step)["step"])) == (4, 4)
  cfg = dataclasses.replace(config_lib.parse(transformer_configs.get_config(
      "numbers,smoke")).train, keep_best_by="eval/bleu", bleu_every_steps=2)
  tracker = early_stopping.Best(cfg, str(tmp_path))
  manager = checkpoint.manager(str(tmp_path), 2, keep_best_by="eval/bleu")
  for step, bleu in ((6, 20.0), (8, 35.0)):
    tracker.update(step, {"eval/bleu": bleu})
    manager.save(step, args=ocp.args.StandardSave({"step": jnp.array(step)}),
                 metrics=tracker.metrics(step))
  manager.wait_until_finished()
  assert tracker.improved(8) and not tracker.improved(6)
  assert checkpoint.best_step(str(tmp_path), "eval/bleu")[1] == 8
  assert json.loads((tmp_path / "best.json").read_text())["step"] == 8


def test_dropout_masks_differ_across_microbatches_and_steps_and_repeat_on_resume(
    monkeypatch):
  """Dropout's keys: each step folds in its number and each of its microbatches its
  index (train.grad_accum_steps), so no two draw the same masks; a step run again from
  the same state (as after a resume) draws the same ones. The masks are recorded as
  Flax's Dropout draws them."""
  drawn = []
  real = jax.random.bernoulli
  def recorded(*args, **kwargs):
    mask = real(*args, **kwargs)
    jax.debug.callback(lambda m: drawn.append(np.asarray(m).tobytes()), mask)
    return mask
  monkeypatch.setattr(jax.random, "bernoulli", recorded)
  config = _tiny_config(4)
  config.train.update(grad_accum_steps=2, mesh_shape=(1, 1, 1))
  cfg = config_lib.with_vocab(config_lib.parse(config), 37)
  run, state = run_lib.make_run(cfg, partitioning.make_mesh((1, 1, 1), jax.devices()[:1]))
  rng = np.random.default_rng(0)
  batch = {"inputs": jnp.asarray(rng.integers(3, 37, (4, 8)), jnp.int32),
           "targets": jnp.asarray(rng.integers(3, 37, (4, 8)), jnp.int32)}

  def masks_of_a_step(state):  # {microbatch's masks}, the state after the step
    drawn.clear()
    state, _ = run.train_step(state, batch, run.dropout_key)
    jax.effects_barrier()
    return list(drawn), state
  start = jax.tree.map(jnp.copy, state)
  first, state = masks_of_a_step(state)
  second, _ = masks_of_a_step(state)
  again, _ = masks_of_a_step(start)
  per_microbatch = len(first) // 2
  assert per_microbatch >= 3 and len(first) == 2 * per_microbatch
  assert not set(first[:per_microbatch]) & set(first[per_microbatch:])
  assert not set(first) & set(second)
  assert sorted(again) == sorted(first)


@pytest.mark.slow
@pytest.mark.parametrize("rng_impl", ["rbg"])
def test_hardware_rng_dropout_resumes_exactly_and_chunked_loss_trains_alike(tmp_path,
                                                                           rng_impl):
  """train.rng_impl: dropout bits from XLA's RngBitGenerator; a run stopped at step 10
  and resumed ends with the parameters of an uninterrupted one. The chunked loss
  (train.loss_chunk_length) gives the same run to float32 rounding."""
  def config(steps, **train):
    config = _tiny_config(steps)
    config.train.update(rng_impl=rng_impl, eval_every_steps=10, checkpoint_every_steps=10,
                        **train)
    return config
  cfg = config_lib.with_vocab(config_lib.parse(config(20)), 37)
  mesh = partitioning.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  run, _ = run_lib.make_run(cfg, mesh, abstract=True)
  assert rng_impl in str(jax.random.key_impl(run.dropout_key))
  loop.train_and_evaluate(config(20), str(tmp_path / "full"))
  loop.train_and_evaluate(config(10), str(tmp_path / "split"))
  loop.train_and_evaluate(config(20), str(tmp_path / "split"))
  full = _final_params(str(tmp_path / "full"), 20)
  split = _final_params(str(tmp_path / "split"), 20)
  jax.tree.map(np.testing.assert_array_equal, full, split)
  loop.train_and_evaluate(config(20, loss_chunk_length=5), str(tmp_path / "chunked"))
  chunked = _final_params(str(tmp_path / "chunked"), 20)
  # Adam (epsilon 1e-9) magnifies rounding in near-zero gradients, by how much depends
  # on the CPU's instruction set (a few elements 0.008 apart on one x86-64 machine): the
  # bound is on each array as a whole.
  def alike(a, b):
    assert np.linalg.norm(a - b) <= 1e-2 * np.linalg.norm(b), (a.shape, a - b)
  jax.tree.map(alike, chunked, full)


def _final_params(workdir, step):
  path = os.path.join(workdir, "checkpoints", str(step), "default")
  return ocp.StandardCheckpointer().restore(path)["params"]


@pytest.mark.slow
def test_training_lowers_the_loss_and_an_interrupted_run_resumes_exactly(tmp_path):
  steps = 40
  full = loop.train_and_evaluate(_tiny_config(steps), str(tmp_path / "full"))
  assert full["step"] == steps
  assert full["recompiled"] == []  # Every program compiled once, ahead of step 1.

  # The same run, stopped after 20 steps and restarted in the same workdir.
  split = str(tmp_path / "split")
  first = loop.train_and_evaluate(_tiny_config(20), split)
  resumed = loop.train_and_evaluate(_tiny_config(steps), split)
  assert first["step"] == 20 and resumed["step"] == steps
  assert first["recompiled"] == resumed["recompiled"] == []
  assert sorted(os.listdir(os.path.join(split, "checkpoints"))) == ["20", "40"]
  with open(os.path.join(split, "config_changes.jsonl")) as f:  # Recorded.
    assert [json.loads(line) for line in f] == [
        {"from_step": 20, "changes": ["train.num_train_steps: 20 -> 40"]}]

  # The same command once more: finished, so nothing is compiled, trained or evaluated.
  with compilation.count_compiles() as compiled:
    again = loop.train_and_evaluate(_tiny_config(steps), split)
  assert (again["bleu"], again["step"], again["history"], len(compiled)) == (
      resumed["bleu"], steps, [], 0)
  assert [s for s, _, _ in results.read_scalars(split)["eval/bleu"]] == [20, steps]  # Once each.

  a, b = _final_params(str(tmp_path / "full"), steps), _final_params(split, steps)
  jax.tree.map(np.testing.assert_array_equal, a, b)
  with open(os.path.join(split, "parameters.txt")) as f:  # clu's parameter overview.
    total = sum(x.size for x in jax.tree.leaves(a))
    assert f"Total: {total:,} " in f.read()

  # translate: one output line per input line, whatever the line holds.
  out = subprocess.run([sys.executable, "-m", "transformer_jax.translate", f"--workdir={split}"],
                       input="one\x0ctwo\n\nthree\r\nfour\u2028five\n".encode(),
                       capture_output=True, timeout=300)
  assert out.returncode == 0, out.stderr.decode()[-2000:]
  lines = out.stdout.decode().split("\n")
  assert len(lines) == 5 and lines[1] == "" and lines[-1] == "", lines
  logged = out.stderr.decode().splitlines()  # Its own line; no library chatter.
  assert len(logged) == 1 and "translate.py" in logged[0], logged
  quiet = subprocess.run([sys.executable, "-m", "transformer_jax.translate",
                          f"--workdir={split}", "--verbosity=-1"], input=b"one\n",
                         capture_output=True, timeout=300)
  assert quiet.returncode == 0 and quiet.stderr == b"", quiet.stderr  # Warnings only: none.

  # Streaming: a line is answered while the input is still open.
  proc = subprocess.Popen([sys.executable, "-m", "transformer_jax.translate",
                           f"--workdir={split}"], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
  proc.stdin.write(b"thirty-four and seven\n")
  proc.stdin.flush()
  assert select.select([proc.stdout], [], [], 120)[0], "no answer before the input ended"
  first = proc.stdout.readline()
  proc.stdin.write(b"eight\n")
  proc.stdin.close()
  assert first.endswith(b"\n") and len(proc.stdout.read().split(b"\n")) == 2
  assert proc.wait(timeout=60) == 0

  # --nbest: the N best per line, best first, Moses-style.
  out = subprocess.run([sys.executable, "-m", "transformer_jax.translate", f"--workdir={split}",
                        "--nbest=2"], input=b"one\n\ntwo\n", capture_output=True, timeout=300)
  assert out.returncode == 0, out.stderr.decode()[-2000:]
  rows = [line.split(" ||| ") for line in out.stdout.decode().splitlines()]
  assert [r[0] for r in rows] == ["0", "0", "2", "2"], rows
  assert float(rows[0][2]) >= float(rows[1][2]) and float(rows[2][2]) >= float(rows[3][2])

  # Inference reads the parameters alone, without building an optimizer.
  params, step = restore.restore_params(restore.load_workdir(split))
  assert step == steps
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(params), b)

  # The last logged window's loss is clearly below the first one's.
  history = full["history"]
  assert len(history) == steps // 10
  assert history[-1]["nll"] < 0.8 * history[0]["nll"]

  # The evaluation command: the average of the last two checkpoints, on the test split.
  scores = evaluate.evaluate_checkpoints(split, "test", average_last=2)
  assert scores["steps"] == [20, 40] and scores["sentences"] == 16
  assert os.path.exists(os.path.join(split, "translations", "test_avg2_step40.txt"))
  # Each variant keeps its own name: results.jsonl and TensorBoard tags never collide.
  single = evaluate.evaluate_checkpoints(split, "test", beam_size=1)
  with open(os.path.join(split, "evaluate", "results.jsonl")) as f:
    recorded = [json.loads(line) for line in f]
  assert [(r["name"], r["bleu"]) for r in recorded] == [
      ("test_avg2", scores["bleu"]), ("test_beam1", single["bleu"])]
  tags = set(results.read_scalars(os.path.join(split, "evaluate")))
  assert {"test_avg2/bleu", "test_beam1/bleu", "test_beam1/chrf"} <= tags
  with pytest.raises(ValueError, match="average_last=3.*keep_checkpoints=3 or more"):
    evaluate.evaluate_checkpoints(split, "test", average_last=3)
  # An ensemble's record names each run and its own steps; its translations, the others
  # (two ensembles of the same first run keep two files).
  whole = str(tmp_path / "full")
  ensemble = evaluate.evaluate_checkpoints(f"{split},{whole}", "test", average_last=2)
  assert ensemble["name"] == "test_avg2_ens2"
  assert ensemble["model"] == f"{split}: checkpoints [20, 40]; {whole}: checkpoints [20, 40]"
  assert ensemble["translations"].endswith("test_avg2_ens2_step40_with_full.txt")


@pytest.mark.parametrize("command", ["translate", "evaluate", "score", "export"])
def test_inference_commands_do_not_import_training(command):
  """Inference sits below training: the commands that read a run import no module of
  transformer_jax.training (no optimizer, no loop); what both need (the checkpoint
  store, the summaries, the losses) lives above it or in the model."""
  assert importlib.util.find_spec("transformer_jax.training.loop")  # The package is real.
  code = (f"import sys, transformer_jax.{command}; print(sorted(m for m in sys.modules "
          "if m.startswith('transformer_jax.training')))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip() == "[]"


def test_the_config_field_reference_is_current_and_complete():
  """docs/config.md is what `python -m transformer_jax.config` writes, and every field
  there has a meaning (config.field's doc)."""
  from conftest import ROOT
  text = config_lib.field_reference()
  with open(os.path.join(ROOT, "docs", "config.md"), encoding="utf-8") as f:
    assert f.read() == text, "docs/config.md is stale: python -m transformer_jax.config"
  rows = [line for line in text.splitlines() if line.startswith("| `")]
  assert len(rows) == sum(len(dataclasses.fields(type(f.default)))
                          for f in dataclasses.fields(config_lib.Config)) - 1  # vocab_size
  assert all(not row.endswith("|  |") for row in rows), [r for r in rows if r.endswith("|  |")]
