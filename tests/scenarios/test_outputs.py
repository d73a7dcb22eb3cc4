"""Outputs that never lie and inputs never destroyed: translate's --output is whole or
untouched, and never its own input."""

import glob
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, assert_one_line_error, smoke_run_copy, xla_flags

ENV = {**os.environ, "XLA_FLAGS": xla_flags(1), "JAX_PLATFORMS": "cpu"}


@pytest.fixture(scope="module")
def workdir(smoke_run, tmp_path_factory):
  """A 20-step smoke run of the embedded default (the session's, copied)."""
  return smoke_run_copy(smoke_run, tmp_path_factory.mktemp("outputs"))


def _translate(workdir, *flags, **kwargs):
  return subprocess.Popen([sys.executable, "-m", "transformer_jax.translate",
                           f"--workdir={workdir}", *flags], cwd=ROOT, env=ENV,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def test_an_output_that_is_the_input_is_refused_through_any_path(workdir, tmp_path):
  """The same file as --output, through a link or `..`: one line, exit 2, the input's
  sentences still there."""
  source = tmp_path / "src.txt"
  source.write_text("thirty-four and seven\none hundred one\n")
  (tmp_path / "link.txt").symlink_to(source)
  (tmp_path / "sub").mkdir()
  for output in (source, tmp_path / "link.txt", tmp_path / "sub" / ".." / "src.txt"):
    proc = _translate(workdir, f"--input={source}", f"--output={output}")
    _, err = proc.communicate(timeout=300)
    assert_one_line_error(proc.returncode, err, f"--output={output} is the input file")
    assert source.read_text() == "thirty-four and seven\none hundred one\n"


@pytest.mark.slow
def test_a_translation_stopped_midway_leaves_the_old_output_untouched(workdir, tmp_path):
  """SIGTERM while the lines are being translated (its temporary file growing): exit
  75, one line saying the output was kept, the old output as it was, no temporary file
  left. The same command run to the end writes every line."""
  source = tmp_path / "src.txt"
  source.write_text("".join(f"{n} thousand and {n}\n" for n in
                            ("one two three four five six seven eight nine".split() * 300)))
  output = tmp_path / "hyp.txt"
  output.write_text("the previous translations\n")
  flags = [f"--input={source}", f"--output={output}", "--batch_size=8", "--beam_size=1"]
  proc = _translate(workdir, *flags)
  pattern = str(tmp_path / ".hyp.txt.*.tmp")
  deadline = time.time() + 300
  while not any(os.path.getsize(p) for p in glob.glob(pattern)) and time.time() < deadline:
    assert proc.poll() is None, proc.communicate()
    time.sleep(0.05)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == 75, err[-2000:]
  lines = [l for l in err.splitlines() if l.strip() and not l.startswith(("I", "W"))]
  assert lines == [f"stopped by SIGTERM before the last line was translated: "
                   f"--output={output} kept as it was."], err[-2000:]
  assert output.read_text() == "the previous translations\n"
  assert sorted(os.listdir(tmp_path)) == ["hyp.txt", "src.txt"]
  proc = _translate(workdir, *flags)
  _, err = proc.communicate(timeout=600)
  assert proc.returncode == 0, err[-2000:]
  assert output.read_text().count("\n") == 2700


LIVE_STEPS = 40
LIVE = ["--config=configs/transformer.py:numbers,smoke",
        f"--config.train.num_train_steps={LIVE_STEPS}", "--config.train.keep_checkpoints=2",
        "--config.train.eval_every_steps=1000", "--config.train.log_every_steps=1000"]


@pytest.mark.slow
def test_a_run_read_while_it_trains_is_read_whole_and_left_undisturbed(tmp_path):
  """What evaluate --average_last=2 and translate choose, read in a loop while the run
  trains with a checkpoint every step and keeps 2 (so it deletes one every step): every
  read is a whole set of the checkpoints it names (chosen again when the trainer
  deleted one meanwhile), none is called damaged, and the run ends as an undisturbed
  one does (no reader, no checkpoint but the last): its last checkpoint the same, bit
  for bit."""
  from conftest import checkpoint_state
  import jax
  import numpy as np
  from transformer_jax.inference import restore
  live, alone = tmp_path / "live", tmp_path / "alone"
  trainer = subprocess.Popen(
      [sys.executable, "-m", "transformer_jax.main", f"--workdir={live}", *LIVE,
       "--config.train.checkpoint_every_steps=1"], cwd=ROOT, env=ENV,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 300
  while len(glob.glob(str(live / "checkpoints" / "[0-9]*"))) < 2 and time.time() < deadline:
    time.sleep(0.1)
  reads, errors = [], []
  while trainer.poll() is None:
    try:
      trained = restore.load_workdir(str(live))
      _, steps, _ = restore.chosen_params(trained, 2)
      _, latest, _ = restore.chosen_params(trained, 1, exact=True)
      assert len(steps) == 2 and steps[0] < steps[1], steps
      reads.append((steps, latest))
    except Exception as e:  # Every failure is recorded, and fails the test below.
      errors.append(f"{type(e).__name__}: {e}")
  out, err = trainer.communicate()
  assert trainer.returncode == 0, err[-3000:]
  assert not errors, errors[:3]
  assert len(reads) >= 3, reads
  undisturbed = subprocess.run([sys.executable, "-m", "transformer_jax.main",
                                f"--workdir={alone}", *LIVE,
                                f"--config.train.checkpoint_every_steps={LIVE_STEPS}"],
                               cwd=ROOT, env=ENV,
                               capture_output=True, text=True, timeout=600)
  assert undisturbed.returncode == 0, undisturbed.stderr[-3000:]
  jax.tree.map(np.testing.assert_array_equal, checkpoint_state(str(live), LIVE_STEPS),
               checkpoint_state(str(alone), LIVE_STEPS))


@pytest.mark.slow
def test_a_full_disk_under_an_output_is_one_line_and_keeps_what_was_there(workdir, tmp_path):
  """translate's output and both exports on a 64 KB tmpfs (a mount namespace of its
  own): each ends in one line, exit 74; the file that was there is as it was, and
  nothing half-written is left beside it."""
  source = tmp_path / "src.txt"
  source.write_text("".join(f"{n} thousand and {n}\n" for n in
                            ("one two three four five six seven eight nine".split() * 300)))
  disk = tmp_path / "disk"
  commands = {
      "translate": ["transformer_jax.translate", f"--workdir={workdir}", f"--input={source}",
                    f"--output={disk}/hyp.txt", "--beam_size=1"],
      "ctranslate2": ["transformer_jax.export", f"--workdir={workdir}",
                      f"--output={disk}/ct2"],
      "huggingface": ["transformer_jax.export", "--format=huggingface", f"--workdir={workdir}",
                      f"--output={disk}/hf"]}
  script = [f"mkdir -p {disk} && mount -t tmpfs -o size=64k tmpfs {disk} && "
            f"echo 'the previous translations' > {disk}/hyp.txt"]
  for name, command in commands.items():
    script.append(f"{sys.executable} -m {' '.join(command)} > {tmp_path}/{name}.log 2>&1; "
                  f"echo $? > {tmp_path}/{name}.code")
  script.append(f"ls -A {disk} > {tmp_path}/left.txt; cat {disk}/hyp.txt > {tmp_path}/hyp.txt")
  unshare = ["unshare", "--mount"] + ["--map-root-user"] * (os.geteuid() != 0)
  done = subprocess.run([*unshare, "bash", "-c", " && ".join(script[:1]) + "; " +
                         "; ".join(script[1:])], cwd=ROOT, env=ENV, timeout=900,
                        capture_output=True, text=True)
  if not (tmp_path / "left.txt").exists():
    pytest.skip(f"no mount namespace here for a small tmpfs: {done.stderr[-300:]}")
  for name in commands:
    log = (tmp_path / f"{name}.log").read_text()
    assert (tmp_path / f"{name}.code").read_text().strip() == "74", log[-3000:]
    lines = [l for l in log.splitlines() if l.strip() and not l.startswith(("I", "W"))]
    assert len(lines) == 1 and lines[0].startswith("error: no space left on the device"), log
  assert (tmp_path / "hyp.txt").read_text() == "the previous translations\n"
  assert (tmp_path / "left.txt").read_text().split() == ["hyp.txt"]


@pytest.mark.slow
def test_a_full_disk_in_training_and_evaluate_is_one_line_naming_the_file(workdir, tmp_path):
  """Each writer of a run on a tmpfs that fills at its turn: the tokenizer (64 KB), the
  token cache (300 KB), the lease and the TensorBoard events (the disk filled but 0 or
  4 KB), and evaluate on a finished run (filled): exit 74, one line naming the file
  being written, every file already there unchanged and no temporary left; the same
  command, run again once there is space, finishes."""
  disk = tmp_path / "disk"
  train = (f"{sys.executable} -m transformer_jax.main "
           f"--config=configs/transformer.py:numbers,smoke --workdir={disk}/run")
  evaluate = f"{sys.executable} -m transformer_jax.evaluate --workdir={disk}/run --split=eval"
  before = f"cp -a {workdir}/config.json {workdir}/tokenizer.model {workdir}/tokenized {disk}/run/"
  fill = f"(dd if=/dev/zero of={disk}/filler bs=4k 2>/dev/null; true)"
  cases = {  # name: (size, preparation, command, what the line names)
      "tokenizer": ("64k", "mkdir run", train, "run/tokenizer.model "),
      "cache": ("300k", "mkdir run", train, "run/tokenized/"),
      "lease": ("4m", f"mkdir run && {before} && {fill}", train, "run/lock.json."),
      "events": ("4m", f"mkdir run && {before} && {fill} && truncate -s -4K {disk}/filler",
                 train, "run/events.out.tfevents."),
      "evaluate": ("4m", f"cp -a {workdir} {disk}/run && {fill}", evaluate,
                   "run/translations/eval_step"),
  }
  script = [f"mkdir -p {disk}"]
  for name, (size, prepare, command, _) in cases.items():
    log = f"{tmp_path}/{name}"
    script += [f"mount -t tmpfs -o size={size} tmpfs {disk} && cd {disk} && {prepare} && cd -",
               f"(cd {disk}/run && find . -type f | sort | xargs -r md5sum) > {log}.before",
               f"{command} > {log}.log 2>&1; echo $? > {log}.code",
               f"(cd {disk}/run && find . -type f | sort | xargs -r md5sum) > {log}.after",
               f"rm -f {disk}/filler && mount -o remount,size=8m {disk}",
               f"{command} > {log}.again 2>&1; echo $? > {log}.again_code",
               f"umount {disk}"]
  unshare = ["unshare", "--mount"] + ["--map-root-user"] * (os.geteuid() != 0)
  done = subprocess.run([*unshare, "bash", "-c", "; ".join(script)], cwd=ROOT, env=ENV,
                        timeout=1200, capture_output=True, text=True)
  if not (tmp_path / "tokenizer.code").exists():
    pytest.skip(f"no mount namespace here for a small tmpfs: {done.stderr[-300:]}")
  for name, (_, _, _, named) in cases.items():
    log = (tmp_path / f"{name}.log").read_text()
    assert (tmp_path / f"{name}.code").read_text().strip() == "74", (name, log[-3000:])
    lines = [l for l in log.splitlines() if l.strip() and not l.startswith(("I", "W"))]
    assert len(lines) == 1, (name, log[-3000:])
    assert lines[0].startswith(f"error: no space left on the device of {disk}/{named}"), (
        name, lines[0])
    before, after = ((tmp_path / f"{name}.{when}").read_text().splitlines()
                     for when in ("before", "after"))
    assert set(before) <= set(after), (name, sorted(set(before) - set(after)))
    half = [l for l in after if any(m in l for m in (".tmp", ".partial", "lock.json."))]
    assert not half, (name, half)
    assert (tmp_path / f"{name}.again_code").read_text().strip() == "0", (
        name, (tmp_path / f"{name}.again").read_text()[-3000:])


def test_translates_output_is_put_in_place_by_one_rename(tmp_path):
  """The finished translations reach --output by renaming the file they were written
  to (its inode becomes the output's), never by copying it there; what held the old
  output (a hard link, as a reader has it open) keeps the old text; nothing is left."""
  from transformer_jax import translate
  output = tmp_path / "hyp.txt"
  output.write_text("the previous translations\n")
  os.link(output, tmp_path / "reader.txt")
  with translate._output(str(output)) as out:
    out.write("new\n")
    written = os.fstat(out.fileno()).st_ino
  assert os.stat(output).st_ino == written
  assert output.read_text() == "new\n"
  assert (tmp_path / "reader.txt").read_text() == "the previous translations\n"
  assert sorted(os.listdir(tmp_path)) == ["hyp.txt", "reader.txt"]


@pytest.mark.parametrize("fails", [False, True])
def test_a_readers_hidden_folder_of_links_is_removed_when_it_ends(tmp_path, fails):
  """While a run trains (its lease is there), a read holds the checkpoints it chose by
  hard links in WORKDIR/.reading-*: the read goes through them, and the folder is gone
  when the read ends, whether it returned or failed."""
  import flax.linen as nn
  import jax
  import numpy as np
  import orbax.checkpoint as ocp
  from conftest import smoke_config
  from transformer_jax import checkpoint
  from transformer_jax.inference import restore
  from transformer_jax.model.transformer import Transformer, init_params
  cfg = smoke_config()
  model = Transformer(cfg.model)
  shapes = nn.meta.unbox(jax.eval_shape(lambda: init_params(model, jax.random.key(0))))
  mngr = checkpoint.manager(str(tmp_path), keep=10)
  for step in (10, 20):
    params = jax.tree.map(lambda x: np.full(x.shape, step, x.dtype), shapes)
    mngr.save(step, args=ocp.args.StandardSave({"params": params, "step": step}))
  mngr.wait_until_finished()
  (tmp_path / restore.LEASE).write_text("{}")  # A run trains here.
  trained = restore.TrainedModel(str(tmp_path), cfg, None, model)
  read_from, listed = [], restore._listed

  def spy(run, step):
    read_from.append(run.workdir)
    if fails:
      raise RuntimeError("a read that fails")
    return listed(run, step)

  restore._listed, error = spy, None
  try:
    _, steps, _ = restore.chosen_params(trained, 2)
    assert steps == [10, 20]
  except RuntimeError as e:
    error = e
  finally:
    restore._listed = listed
  assert (error is not None) == fails
  view = read_from[0]  # (A failed read is read again in place, to name the damage.)
  assert os.path.basename(view).startswith(".reading-") and \
      os.path.dirname(view) == str(tmp_path), read_from
  assert not glob.glob(str(tmp_path / ".reading-*"))
