"""Workdirs on a non-local filesystem.

gs:// needs credentials and a network; TensorFlow's in-memory `ram://` filesystem is
reached through the same tf.io.gfile layer that etils.epath uses for gs://, so a run
whose workdir is on ram:// shows that nothing the project writes or reads goes through
os.path or open() (which would turn gs://bucket/run into the local ./gs:/bucket/run).
Checkpoints are the exception: Orbax sends gs:// paths to TensorStore's GCS driver,
which has no in-memory twin, so this test keeps them in a local directory.
"""

import dataclasses
import json
import os

import numpy as np
import pytest
import tensorflow as tf
from etils import epath
from etils.epath import backend, gpath

from conftest import numbers_data
from launch import sweep, trials as trials_lib
from transformer_jax import evaluate, files, summaries
from transformer_jax.inference import restore
from transformer_jax import checkpoint
from transformer_jax.data import tasks
from transformer_jax.training import loop
from configs import transformer as configs


@pytest.fixture
def ram(monkeypatch):
  """epath treats ram://... as it treats gs://...: through TensorFlow's gfile."""
  monkeypatch.setattr(gpath, "_URI_PREFIXES", gpath._URI_PREFIXES + ("ram://",))
  monkeypatch.setattr(gpath, "_URI_SCHEMES", gpath._URI_SCHEMES | {"ram"})
  monkeypatch.setitem(gpath._URI_MAP_ROOT, "ram://", "/ram/")
  monkeypatch.setitem(gpath._PREFIX_TO_BACKEND, "ram", backend.tf_backend)
  epath.register_path_cls("ram://")(gpath.PosixGPath)
  assert type(epath.Path("ram://x")).__name__ == "PosixGPath"
  yield "ram://bucket"
  if tf.io.gfile.exists("ram://bucket"):
    tf.io.gfile.rmtree("ram://bucket")


def test_checkpoints_of_a_gs_workdir_stay_on_gs():
  assert str(checkpoint.directory("gs://bucket/run")) == "gs://bucket/run/checkpoints"
  assert str(checkpoint.directory("run")) == os.path.join(os.getcwd(), "run", "checkpoints")


def test_files_write_whole_and_append_on_a_remote_filesystem(ram):
  path = f"{ram}/dir/file.txt"
  files.write_atomic(path, "one\n")
  files.append_line(path, "two")
  assert tf.io.gfile.GFile(path).read() == "one\ntwo\n"
  assert tf.io.gfile.listdir(f"{ram}/dir") == ["file.txt"]  # No temporary left.

  experiment = sweep.Experiment("exp", "exp.py", "configs/transformer.py:numbers",
                                (sweep.Trial("t", ()),), "An experiment.")
  [run] = trials_lib.plan(experiment, ram)
  trials_lib.record(run, experiment, {"fingerprint": "0"})
  assert json.loads(tf.io.gfile.GFile(f"{ram}/exp/t/trial.json").read())["trial"] == "t"
  assert not trials_lib.finished(run)


@pytest.mark.slow
def test_a_run_evaluation_and_translation_with_the_workdir_on_ram(ram, tmp_path,
                                                                   monkeypatch):
  local_checkpoints = tmp_path / "checkpoints"
  monkeypatch.setattr(checkpoint, "directory", lambda workdir: epath.Path(local_checkpoints))
  workdir = f"{ram}/run"
  config = configs.get_config("numbers,smoke")
  result = loop.train_and_evaluate(config, workdir)
  assert result["step"] == config.train.num_train_steps

  listing = set(tf.io.gfile.listdir(workdir))
  assert {"config.json", "tokenizer.model", "results.json", "translations"} <= {
      name.rstrip("/") for name in listing}
  assert any(name.startswith("events.out.tfevents") for name in listing)
  events = summaries.read_scalars(workdir)  # TensorBoard's loader, through tf.io.gfile.
  assert [step for step, _, _ in events["train/loss"]] == [5, 10, 15, 20]
  assert json.loads(tf.io.gfile.GFile(f"{workdir}/results.json").read())["step"] == 20
  assert not os.path.exists("ram:")  # Nothing landed in a local look-alike directory.

  resumed = loop.train_and_evaluate(config, workdir)  # Finds config and tokenizer there.
  assert resumed["step"] == 20

  scores = evaluate.evaluate_checkpoints(workdir, "test")
  assert scores["translations"] == f"{workdir}/translations/test_step20.txt"
  assert tf.io.gfile.exists(scores["translations"])
  assert tf.io.gfile.exists(f"{workdir}/evaluate/results.jsonl")  # The record, on ram://.
  params, step = restore.restore_params(restore.load_workdir(workdir))
  assert step == 20
  assert summaries.read_scalars(workdir)["eval/bleu"][-1][0] == 20  # launch.results


def test_the_workdir_lease_on_an_object_store(ram, monkeypatch):
  """gs:// has no exclusive create through epath: the lease is written, read back after
  SETTLE_S and held only if still this run's; a second start is refused, and the
  holder's release frees the workdir (here on ram://, through the same gfile layer)."""
  from transformer_jax.training import workdir_lock
  monkeypatch.setattr(workdir_lock, "SETTLE_S", 0.05)
  lease = workdir_lock.Lease(f"{ram}/run").acquire()
  assert json.loads(tf.io.gfile.GFile(f"{ram}/run/lock.json").read())["pid"] == os.getpid()
  with pytest.raises(workdir_lock.Busy, match=f"in use by process {os.getpid()}"):
    workdir_lock.Lease(f"{ram}/run").acquire()
  lease.release()
  assert not tf.io.gfile.exists(f"{ram}/run/lock.json")
  workdir_lock.Lease(f"{ram}/run").acquire().release()


def test_a_tokenized_split_in_a_bucket_is_made_once_and_copied_by_every_other_host(
    ram, tmp_path, monkeypatch, caplog):
  """data.cache_dir on a bucket (ram:// here, as gs://): the first host tokenizes into
  its local copy (memory maps need one) and puts the split in the bucket; another host
  (a recreated TPU VM) copies it, tokenizing nothing, and trains on the same ids; a copy
  damaged in the bucket is named, rebuilt locally and never trained on."""
  caplog.set_level("INFO")
  data = dataclasses.replace(numbers_data(), cache_dir=f"{ram}/tokenized")
  monkeypatch.setattr(tasks, "LOCAL_CACHE", str(tmp_path / "host_a"))
  first = tasks.load_task(data, str(tmp_path / "a"))
  [name] = [d for d in os.listdir(tmp_path / "host_a") if not d.endswith(".lock")]
  bucket = f"{ram}/tokenized/{name}"
  for file in os.listdir(tmp_path / "host_a" / name):  # Every file, meta.json included.
    assert tf.io.gfile.GFile(f"{bucket}/{file}", "rb").read() == \
        (tmp_path / "host_a" / name / file).read_bytes(), file

  data = dataclasses.replace(data, tokenizer_file=str(tmp_path / "a" / "tokenizer.model"))
  monkeypatch.setattr(tasks, "LOCAL_CACHE", str(tmp_path / "host_b"))
  caplog.clear()
  second = tasks.load_task(data, str(tmp_path / "b"))
  assert f"copied the tokenized training split from {bucket}" in caplog.text
  assert "tokenized the training split once" not in caplog.text
  assert isinstance(second.train.targets.tokens, np.memmap)
  for a, b in ((first.train.inputs, second.train.inputs),
               (first.train.targets, second.train.targets)):
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.lengths, b.lengths)

  damaged = tf.io.gfile.GFile(f"{bucket}/targets.tokens.bin", "rb").read()
  with tf.io.gfile.GFile(f"{bucket}/targets.tokens.bin", "wb") as f:
    f.write(damaged[:-2])
  monkeypatch.setattr(tasks, "LOCAL_CACHE", str(tmp_path / "host_c"))
  caplog.clear()
  third = tasks.load_task(data, str(tmp_path / "c"))
  assert "targets.tokens.bin does not match its checksum" in caplog.text
  assert "tokenized the training split once" in caplog.text
  np.testing.assert_array_equal(first.train.targets.tokens, third.train.targets.tokens)
