"""The training loop end to end (transformer_jax/training/loop.py): epoch cadences,
dropout's bits, and exact resume."""

import json
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
from conftest import assert_within_rounding, max_relative_difference, tiny_training_config
from conftest import toy_data

from transformer_jax import config as config_lib, evaluate, partitioning, summaries
from transformer_jax.data import batching
from transformer_jax.inference import restore
from transformer_jax.training import compilation, loop, run as run_lib


def test_epoch_cadences_are_the_steps_of_one_pass_over_the_training_pairs():
  """train.eval_every_epochs and checkpoint_every_epochs (fairseq's --validate-interval
  and --save-interval, for its recipes): an epoch is as many steps as the token-budget
  batches that cover the training pairs once."""
  data = toy_data(50)
  config = transformer_configs.get_config("numbers,smoke")
  config.train.update(batch_tokens=256, max_length_buckets=8, eval_every_epochs=1,
                      checkpoint_every_epochs=3)
  cfg = config_lib.parse(config)
  _, _, starts, _ = batching._token_budget_epoch(data, cfg.train, 0)
  epoch = batching.steps_per_epoch(data, cfg.train)
  assert epoch == len(starts) > 1
  task = types.SimpleNamespace(train=data, tokenizer=types.SimpleNamespace(vocab_size=37))
  train = run_lib.with_task(cfg, task).train
  assert (train.eval_every_steps, train.checkpoint_every_steps) == (epoch, 3 * epoch)
  config.train.update(eval_every_epochs=0)  # Steps, as before, where an epoch field is 0.
  assert run_lib.with_task(config_lib.parse(config), task).train.eval_every_steps == 10
  config.train.update(batching="sentences")  # No fixed number of steps an epoch.
  with pytest.raises(ValueError, match='train.checkpoint_every_epochs=3 is invalid.*"tokens"'):
    config_lib.parse(config)


def test_dropout_masks_differ_across_microbatches_and_steps_and_repeat_on_resume(
    monkeypatch):
  """Dropout's keys: each step folds in its number and each of its microbatches its
  index (train.grad_accum_steps), and each layer's site draws its own, so no two draw
  the same masks; a step run again from the same state (as after a resume) draws the
  same ones. The masks are recorded as Flax's Dropout draws them."""
  drawn = []
  real = jax.random.bernoulli
  def recorded(*args, **kwargs):
    mask = real(*args, **kwargs)
    jax.debug.callback(lambda m: drawn.append(np.asarray(m).tobytes()), mask)
    return mask
  monkeypatch.setattr(jax.random, "bernoulli", recorded)
  config = tiny_training_config(4)
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
  assert len(set(first)) == len(first)  # Every layer's site its own.
  assert not set(first[:per_microbatch]) & set(first[per_microbatch:])
  assert not set(first) & set(second)
  assert sorted(again) == sorted(first)


@pytest.mark.slow
@pytest.mark.parametrize("rng_impl", ["rbg"])
def test_hardware_rng_dropout_resumes_exactly_and_chunked_loss_trains_alike(tmp_path,
                                                                           rng_impl):
  """train.rng_impl: dropout bits from XLA's RngBitGenerator; a run stopped at step 10
  and resumed ends with the parameters of an uninterrupted one. The chunked loss
  (train.loss_chunk_length) gives the same run to within ROUNDING_K times the control
  (the run from parameters one ulp away, conftest)."""
  def config(steps, **train):
    config = tiny_training_config(steps)
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
  loop.train_and_evaluate(config(20, perturb_init_ulps=1), str(tmp_path / "control"))
  chunked = _final_params(str(tmp_path / "chunked"), 20)
  control = _final_params(str(tmp_path / "control"), 20)
  assert_within_rounding({"params": max_relative_difference(chunked, full)},
                         {"params": max_relative_difference(control, full)})


def _final_params(workdir, step):
  path = os.path.join(workdir, "checkpoints", str(step), "default")
  return ocp.StandardCheckpointer().restore(path)["params"]


@pytest.mark.slow
def test_training_lowers_the_loss_and_an_interrupted_run_resumes_exactly(tmp_path):
  steps = 40
  full = loop.train_and_evaluate(tiny_training_config(steps), str(tmp_path / "full"))
  assert full["step"] == steps
  assert full["recompiled"] == []  # Every program compiled once, ahead of step 1.

  # The same run, stopped after 20 steps and restarted in the same workdir.
  split = str(tmp_path / "split")
  first = loop.train_and_evaluate(tiny_training_config(20), split)
  resumed = loop.train_and_evaluate(tiny_training_config(steps), split)
  assert first["step"] == 20 and resumed["step"] == steps
  assert first["recompiled"] == resumed["recompiled"] == []
  assert sorted(os.listdir(os.path.join(split, "checkpoints"))) == ["20", "40"]
  with open(os.path.join(split, "config_changes.jsonl")) as f:  # Recorded.
    assert [json.loads(line) for line in f] == [
        {"from_step": 20, "changes": ["train.num_train_steps: 20 -> 40"]}]

  # The same command once more: finished, so nothing is compiled, trained or evaluated.
  with compilation.count_compiles() as compiled:
    again = loop.train_and_evaluate(tiny_training_config(steps), split)
  assert (again["bleu"], again["step"], again["history"], len(compiled)) == (
      resumed["bleu"], steps, [], 0)
  assert [s for s, _, _ in summaries.read_scalars(split)["eval/bleu"]] == [20, steps]  # Once each.

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
  tags = set(summaries.read_scalars(os.path.join(split, "evaluate")))
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
