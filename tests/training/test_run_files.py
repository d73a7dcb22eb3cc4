"""A run's folder that nothing corrupts: two starts on one workdir, a resume without
config.json and with another model, a read-only run scored, a damaged checkpoint or
run file named in one line with what to do. The real entry points, as subprocesses."""

import os
import shutil
import subprocess
import sys

import jax
import pytest

from configs import transformer as configs
from conftest import (ROOT, assert_one_line_error, checkpoint_state, run_commands, run_forked,
                      xla_flags)
from transformer_jax import config as config_lib, partitioning
from transformer_jax.data import batching, parallel_data
from transformer_jax.training import run_files, workdir_lock

SMOKE = ["--config=configs/transformer.py:numbers,smoke", "--config.train.log_every_steps=10",
         "--config.train.checkpoint_every_steps=10"]
ENV = {**os.environ, "XLA_FLAGS": xla_flags(1), "JAX_PLATFORMS": "cpu"}


def _start(workdir, *flags):
  return subprocess.Popen([sys.executable, "-m", "transformer_jax.main",
                           f"--workdir={workdir}", *SMOKE, *flags], cwd=ROOT, env=ENV,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A finished 20-step run with checkpoints 10 and 20."""
  workdir = tmp_path_factory.mktemp("trained") / "run"
  proc = _start(workdir)
  out, err = proc.communicate(timeout=600)
  assert proc.returncode == 0, (out + err)[-3000:]
  return workdir


@pytest.fixture
def run(trained, tmp_path):
  """A copy of the trained run, to damage."""
  shutil.copytree(trained, tmp_path / "run")
  return tmp_path / "run"


def _listing(workdir) -> dict[str, bytes]:
  return {os.path.relpath(os.path.join(d, f), workdir):
          open(os.path.join(d, f), "rb").read()
          for d, _, names in os.walk(workdir) for f in names}


@pytest.mark.slow
def test_two_runs_started_together_on_one_workdir_one_trains_the_other_touches_nothing(
    tmp_path):
  workdir = tmp_path / "run"
  procs = [_start(workdir) for _ in range(2)]
  outputs = [p.communicate(timeout=600) for p in procs]
  codes = sorted(p.returncode for p in procs)
  assert codes == [0, 2], outputs
  refused = next(err for p, (_, err) in zip(procs, outputs) if p.returncode == 2)
  assert_one_line_error(2, refused, f"{workdir} is in use by process ")
  for step in (10, 20):  # The run's checkpoints are whole.
    assert int(checkpoint_state(str(workdir), step)["step"]) == step
  assert (workdir / "results.json").exists()
  assert not (workdir / workdir_lock.NAME).exists()  # Released at the end.
  assert not (workdir / "unreadable_checkpoints").exists()


def test_a_resume_without_config_json_and_another_model_is_refused_moving_nothing(run):
  """The shapes in the newest checkpoint's metadata stand in for the missing config:
  a mismatch is one line, the checkpoints stay where they are, no config is written."""
  (run / "config.json").unlink()
  before = _listing(run)
  [(code, err)] = run_commands([[*SMOKE, f"--workdir={run}", "--config.model.d_model=64"]],
                               run.parent)
  assert_one_line_error(code, err, f"checkpoint step 20 in {run / 'checkpoints'} was made "
                        "with another model than this config's: params/")
  assert "(32, 4, 8) in the checkpoint, (64, 4, 16) with this config" in err
  assert _listing(run) == before


def test_steps_lowered_below_the_newest_checkpoint_stop_in_one_line_writing_nothing(run):
  """train.num_train_steps under the newest checkpoint (20) would resume, train
  nothing and report step 20 as the new setting's result: exit 2, one line saying how
  to go on, nothing in the workdir touched. At 20 (finished) it is the finished run."""
  before = _listing(run)
  [(code, err)] = run_commands(
      [[*SMOKE, f"--workdir={run}", "--config.train.num_train_steps=15"]], run.parent)
  assert_one_line_error(code, err, f"train.num_train_steps=15 is below the newest "
                        f"checkpoint in {run} (step 20): nothing would be trained. To go on "
                        "training, raise train.num_train_steps above 20")
  assert "--step=N" in err
  assert _listing(run) == before
  [(code, _)] = run_commands(
      [[*SMOKE, f"--workdir={run}", "--config.train.num_train_steps=20"]], run.parent)
  assert code == 0


@pytest.mark.parametrize("tokenizer", [True, False])
def test_without_config_json_the_checkpoint_shapes_decide_whether_a_config_fits(
    run, tokenizer):
  """Without the tokenizer too, the vocabulary is the checkpoint's own."""
  (run / "config.json").unlink()
  if not tokenizer:
    (run / "tokenizer.model").unlink()
  mesh = partitioning.make_mesh((1, 1, 1), jax.devices()[:1])
  same = config_lib.parse(configs.get_config("numbers,smoke"))
  run_files.check_checkpoints_without_config(same, mesh, str(run))  # Fits: no error.
  other = configs.get_config("numbers,smoke")
  other.model.num_decoder_layers += 1
  added = f"params/decoder_{other.model.num_decoder_layers - 1}/"
  with pytest.raises(config_lib.InputError, match=f"{added}.*absent in the checkpoint"):
    run_files.check_checkpoints_without_config(config_lib.parse(other), mesh, str(run))


def _read_only(workdir, home):
  """A command prefix: a private mount namespace where `workdir` is mounted read-only
  (refused to root as well), HOME set to `home`."""
  return ("env", f"HOME={home}", "unshare", "-rm", "sh", "-c",
          f'mount --bind "{workdir}" "{workdir}" && '
          f'mount -o remount,bind,ro "{workdir}" "{workdir}" && exec "$@"', "sh")


def test_a_read_only_run_is_evaluated_translated_and_scored(run, tmp_path):
  if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
    pytest.skip("no user and mount namespaces here (unshare -rm) for a read-only mount")
  (tmp_path / "src.txt").write_text("thirty-four\nseven\n")
  (tmp_path / "ref.txt").write_text("vierunddreißig\nsieben\n")
  before = _listing(run)
  prefix = _read_only(run, tmp_path / "home")
  results = run_forked([
      ("transformer_jax.evaluate", [f"--workdir={run}", f"--source={tmp_path / 'src.txt'}",
                                    f"--reference={tmp_path / 'ref.txt'}"], None),
      ("transformer_jax.translate", [f"--workdir={run}", f"--input={tmp_path / 'src.txt'}",
                                     f"--output={tmp_path / 'hyp.txt'}"], None),
      ("transformer_jax.score", [f"--workdir={run}", f"--source={tmp_path / 'src.txt'}",
                                 f"--target={tmp_path / 'ref.txt'}"], None)],
      tmp_path, prefix=prefix)
  for code, _, err in results:
    assert code == 0, err[-3000:]
  assert "is read-only: the translations and scores go to" in results[0][2]
  [kept] = (tmp_path / "home" / ".cache" / "transformer_jax" / "evaluate").iterdir()
  assert (kept / "evaluate" / "results.jsonl").exists()
  assert len((tmp_path / "hyp.txt").read_text().splitlines()) == 2
  assert _listing(run) == before

  [(code, err)] = run_commands([[*SMOKE, f"--workdir={run}/sub"]], tmp_path,
                               prefix=prefix)
  assert_one_line_error(code, err, f"--workdir={run}/sub cannot be written")


def _damage_latest_checkpoint(run):
  """Every array file of checkpoint 20 cut in half, as a failed copy leaves them."""
  for d, _, names in os.walk(run / "checkpoints" / "20"):
    for f in names:
      if os.path.basename(d) == "d":
        os.truncate(os.path.join(d, f), os.path.getsize(os.path.join(d, f)) // 2)


def test_a_damaged_latest_checkpoint_names_the_intact_step_to_use(run, tmp_path):
  _damage_latest_checkpoint(run)
  (tmp_path / "src.txt").write_text("thirty-four\n")
  src = f"--source={tmp_path / 'src.txt'}"
  phrase = (f"checkpoint step 20 in {run / 'checkpoints'} cannot be read: it is damaged or "
            "incomplete")
  for module, argv in [("transformer_jax.translate", [f"--input={tmp_path / 'src.txt'}"]),
                       ("transformer_jax.evaluate", [src, f"--reference={tmp_path / 'src.txt'}"]),
                       ("transformer_jax.score", [src, f"--target={tmp_path / 'src.txt'}"])]:
    [(code, err)] = run_commands([[f"--workdir={run}", *argv]], tmp_path, module)
    assert_one_line_error(code, err, phrase)
    assert "Step 10 reads: pass --step=10 to use it." in err
    assert len(err) < 1000, err  # Not TensorStore's internals.
    [(code, err)] = run_commands([[f"--workdir={run}", "--step=10", *argv]], tmp_path, module)
    assert code == 0, err[-3000:]
  assert (run / "checkpoints" / "20").is_dir()  # Reading moves nothing.


@pytest.mark.parametrize("damage", ["truncated", "deleted"])
def test_a_damaged_tokenizer_is_named_with_how_to_rebuild_it(run, tmp_path, damage):
  path = run / "tokenizer.model"
  if damage == "truncated":
    path.write_bytes(path.read_bytes()[:100])
  else:
    path.unlink()
  phrase = (f"{path} is not a readable SentencePiece model" if damage == "truncated"
            else f"No SentencePiece model at {path}")
  (tmp_path / "src.txt").write_text("thirty-four\n")
  for module, argv in [("transformer_jax.translate", [f"--input={tmp_path / 'src.txt'}"]),
                       ("transformer_jax.evaluate", ["--split=eval"])]:
    [(code, err)] = run_commands([[f"--workdir={run}", *argv]], tmp_path, module)
    assert_one_line_error(code, err, phrase)
    assert "run the run's training command with --prepare_data" in err
  if damage == "truncated":  # A resume says the same (a deleted one is trained again).
    [(code, err)] = run_commands([[*SMOKE, f"--workdir={run}",
                                   "--config.train.num_train_steps=30"]], tmp_path)
    assert_one_line_error(code, err, phrase)


def test_prepare_data_rebuilds_a_lost_tokenizer_as_it_was(run, tmp_path):
  """The fix the messages above give: the same data, the same tokenizer, byte for byte."""
  original = (run / "tokenizer.model").read_bytes()
  (run / "tokenizer.model").unlink()
  [(code, err)] = run_commands([[*SMOKE, f"--workdir={run}", "--prepare_data"]], tmp_path)
  assert code == 0, err[-3000:]
  assert (run / "tokenizer.model").read_bytes() == original


def test_a_damaged_config_json_is_named_with_how_to_write_it_anew(run, tmp_path):
  path = run / "config.json"
  path.write_text(path.read_text()[:50])
  [(code, err)] = run_commands([[f"--workdir={run}", "--split=eval"]], tmp_path,
                               "transformer_jax.evaluate")
  assert_one_line_error(code, err, f"{path} is damaged (")
  assert "--print_config >" in err


def test_pairs_longer_than_the_token_budget_are_counted():
  """train.batch_tokens below a pair's length: that pair is a batch alone, over the
  budget; the loop warns with this count. A pair exactly at the budget fits."""
  side = lambda lengths: parallel_data.Sequences.from_list([[3] * (n - 1) + [1]
                                                         for n in lengths])
  data = parallel_data.ParallelData(side([3, 4, 9, 4]), side([5, 2, 2, 4]))
  assert batching.over_budget(data, 4) == 2  # 5 (a target) and 9 (a source).
  assert batching.over_budget(data, 8) == 1
  assert batching.over_budget(data, 9) == 0


def test_restoring_a_checkpoint_of_another_model_moves_nothing(run):
  """Behind the checks before it: a restore into other shapes is refused in one line,
  never taken for damage (which would set the checkpoint aside)."""
  from transformer_jax import checkpoint
  from transformer_jax.training import run as run_lib
  cfg = configs.get_config("numbers,smoke")
  cfg.model.d_ff *= 2
  cfg = config_lib.with_vocab(config_lib.parse(cfg), 100)
  _, state = run_lib.make_run(cfg, partitioning.make_mesh((1, 1, 1), jax.devices()[:1]),
                            abstract=True)
  with pytest.raises(config_lib.InputError, match="checkpoint step 20 .* another model"):
    checkpoint.restore_state(checkpoint.manager(str(run), 2), state)
  assert sorted(os.listdir(run / "checkpoints")) == ["10", "20"]
  assert not (run / "unreadable_checkpoints").exists()
