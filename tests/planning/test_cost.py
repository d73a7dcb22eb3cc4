"""The cost printed before launch (planning/cost.py): each part counted as the loop
makes it, scaled the way its model says, and labelled with what it rests on."""

import dataclasses

import pytest

from configs import transformer as transformer_configs
from transformer_jax import config as config_lib
from transformer_jax.planning import cost, topology
from transformer_jax.training import cadence


def _config(name: str, **train) -> config_lib.Config:
  cfg = config_lib.parse(transformer_configs.get_config(name))
  return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **train))


def _seconds(parts) -> dict:
  return {p.name: p.seconds for p in parts}


@pytest.mark.parametrize("name", ["base", "big"])
def test_evaluations_and_saves_are_counted_as_the_loop_makes_them(name):
  """Held-out losses and saves every N steps and at the last; BLEU every
  bleu_every_steps, and at the last step only when nothing is averaged."""
  train = _config(name).train
  last = train.num_train_steps
  counts = cost.cadence_counts(train)
  ceil = lambda every: -(-last // every)
  assert counts["evals"] == ceil(train.eval_every_steps)
  assert counts["saves"] == ceil(train.checkpoint_every_steps)
  assert counts["bleus"] == last // train.bleu_every_steps  # Averaged: no extra at the end.
  alone = cost.cadence_counts(dataclasses.replace(train, average_last=1))["bleus"]
  assert alone == ceil(train.bleu_every_steps)
  assert counts == {"base": {"evals": 67, "bleus": 6, "saves": 67},
                    "big": {"evals": 200, "bleus": 20, "saves": 500}}[name]
  # The loop's own test of when it translates is the same function.
  assert cadence.bleu_due(last, 0, last, 1) and not cadence.bleu_due(last, 0, last, 5)


def test_training_scales_with_steps_and_the_real_token_batch_costs_more():
  target = topology.parse("8xH100")
  base = _config("base")
  params = cost.parameter_count(base)
  parts = _seconds(cost.parts(base, target, params))
  double = _seconds(cost.parts(_config("base", num_train_steps=200_000), target, params))
  assert double["training"] == pytest.approx(2 * parts["training"])
  padded = _seconds(cost.parts(_config("base", batch_tokens_count="padded"), target, params))
  rate = cost.step_rate(target, params, None)
  per_step = lambda positions: positions * rate.seconds_per_position + rate.fixed_s
  assert parts["training"] == pytest.approx(100_000 * per_step(25_000 / cost.REAL_SHARE))
  assert padded["training"] == pytest.approx(100_000 * per_step(25_000))
  assert padded["training"] < parts["training"]


def test_a_measured_ratio_corrects_the_kinds_measured_naming_the_batch_it_was_measured_with():
  params = cost.parameter_count(_config("base"))
  h200 = cost.step_rate(topology.parse("1xH200"), params, None)
  measured = cost.MEASURED_STEPS["NVIDIA H200"]
  # On the device and batch it was measured with, the estimate gives the measurement.
  assert measured.positions * h200.seconds_per_position == pytest.approx(measured.step_s,
                                                                         rel=2e-3)
  assert "2026-11-28" in h200.basis and "train.batch_tokens_count=padded" in h200.basis
  v5p = cost.step_rate(topology.parse("v5p-8"), params, None)
  assert "measured over" not in v5p.basis and "lower bound" in v5p.basis
  compiled = {"estimated_step_s": 0.02, "batch": [100, 256], "estimate": "compiler"}
  from_compile = cost.step_rate(topology.parse("v5p-8"), params, compiled)
  assert from_compile.seconds_per_position == pytest.approx(0.02 / 25_600)
  assert ("the compiler's estimate a position of the longest batch (100 x 256, 20.0 ms)"
          in from_compile.basis)


def test_the_measured_models_parameters_are_base_as_measured():
  """The measured step's correction divides by the parameters of the model it timed:
  base with the GPU options' vocabulary padded to 128."""
  cfg = config_lib.parse(transformer_configs.get_config("base"))
  cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_multiple=128))
  count = cost.parameter_count(cfg)
  assert all(m.params == count for m in cost.MEASURED_STEPS.values())
  assert cost.DECODE_MEASURED["params"] == count


def test_gradients_cross_the_network_only_between_hosts():
  params = cost.parameter_count(_config("big"))
  one = cost.step_rate(topology.parse("1xH100"), params, None).fixed_s
  host = cost.step_rate(topology.parse("8xH100"), params, None).fixed_s
  hosts = cost.step_rate(topology.parse("16xH100"), params, None).fixed_s
  assert one == 0 < host < hosts
  assert hosts / host == pytest.approx(cost.NVLINK_GBPS / cost.NETWORK_GBPS * (15 / 16) / (7 / 8))


def test_checkpoints_cost_the_last_save_and_unless_deferred_what_outlasts_the_steps_between():
  cfg, target = _config("big"), topology.parse("v5p-8")
  params = cost.parameter_count(cfg)
  save_s, last_s = 12 * params / 200e6, 16 * params / 200e6  # The last holds the sum.
  waiting = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train,
                                                               defer_checkpoints=False))
  fast = cost.checkpoint_part(waiting, params, step_s=1.0, saves=500, mb_per_s=200)
  assert fast.seconds == pytest.approx(last_s)  # Only the last is waited for.
  slow = cost.checkpoint_part(waiting, params, step_s=0.01, saves=500, mb_per_s=200)
  assert slow.seconds == pytest.approx(499 * (save_s - 600 * 0.01) + last_s)
  slower = cost.checkpoint_part(waiting, params, step_s=0.01, saves=500, mb_per_s=100)
  assert slower.seconds > slow.seconds and "100 MB/s" in slower.basis
  # Deferred (the default): a slow store costs the last save alone.
  deferred = cost.checkpoint_part(cfg, params, step_s=0.01, saves=500, mb_per_s=200)
  assert cfg.train.defer_checkpoints and deferred.seconds == pytest.approx(last_s)
  assert _seconds(cost.parts(cfg, target, params, mb_per_s=100))["checkpoint writes"] > \
      _seconds(cost.parts(cfg, target, params))["checkpoint writes"]


def test_decodes_grow_with_their_sentences_the_model_and_smaller_batches():
  base, big = _config("base"), _config("big")
  target = topology.parse("8xH100")
  b = _seconds(cost.parts(base, target, cost.parameter_count(base)))
  g = _seconds(cost.parts(big, target, cost.parameter_count(big)))
  per = cost.decode_seconds_a_sentence(base, cost.parameter_count(base))[0]
  assert b["mid-run BLEU decodes"] == pytest.approx(6 * 3000 * per)
  assert b["final averaged decodes"] == pytest.approx((3000 + 3003) * per)
  assert g["final averaged decodes"] > b["final averaged decodes"]
  wide = dataclasses.replace(base, decode=dataclasses.replace(base.decode, batch_tokens=16_384))
  assert cost.decode_seconds_a_sentence(wide, cost.DECODE_MEASURED["params"])[0] == \
      pytest.approx(1 / cost.DECODE_MEASURED["sentences_per_s"])
  no_test = dataclasses.replace(base, train=dataclasses.replace(base.train, final_test=False))
  alone = _seconds(cost.parts(no_test, target, cost.parameter_count(base)))
  assert alone["final averaged decodes"] == pytest.approx(3000 * per)


def test_every_part_says_what_it_rests_on_and_unknown_ones_are_left_out_saying_so():
  numbers = config_lib.parse(transformer_configs.get_config("numbers"))
  target = topology.parse("8xH200")
  parts = cost.parts(numbers, target, cost.parameter_count(numbers))
  assert [p.name for p in parts] == ["training", "held-out losses", "mid-run BLEU decodes",
                                     "final averaged decodes", "checkpoint writes",
                                     "compilation", "data preparation"]
  assert all(p.basis.startswith(("estimated", "measured")) or p.seconds is None
             for p in parts)
  unknown = [p for p in parts if p.seconds is None]
  assert unknown and all(p.basis.startswith("not estimated") for p in unknown)
  lines = cost.describe("numbers", target, parts)
  total = sum(p.seconds for p in parts if p.seconds is not None) / 3600
  assert lines[0] == (f"# numbers: cost on 8xH200 (8 GPUs, 1 host(s)): {total:,.2f} h, "
                      f"{8 * total:,.1f} GPU-hours in all, parts not estimated left out")
  assert len(lines) == 1 + len(parts)
  assert any(line.startswith("#   mid-run BLEU decodes: ?; not estimated") for line in lines)
