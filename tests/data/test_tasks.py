"""A task loaded at WMT scale (transformer_jax/data/tasks.py, tokenized.py): tokenized
once, memory-mapped, shared by a sweep."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import numbers_data, ROOT
from transformer_jax.config import NotPrepared
from transformer_jax.data import corpora, parallel_data, tasks, tokenized


# --- at WMT scale: tokenize once, memory-map, plan epochs with numpy ----------

def test_the_training_split_is_tokenized_once_then_memory_mapped(tmp_path, caplog):
  caplog.set_level("INFO")
  first = tasks.load_task(numbers_data(), str(tmp_path))
  assert "tokenized the training split once" in caplog.text
  [cached] = os.listdir(tmp_path / "tokenized")[:1]
  caplog.clear()
  again = tasks.load_task(numbers_data(), str(tmp_path))  # A restart.
  assert "tokenized" not in caplog.text
  assert isinstance(again.train.inputs.tokens, np.memmap)
  for k in (0, 7, 123):
    for a, b in [(first.train.inputs, again.train.inputs),
                 (first.train.targets, again.train.targets)]:
      np.testing.assert_array_equal(a[k], b[k])
  # The same ids as tokenizing in memory.
  src, tgt = corpora.corpus(numbers_data()).split("train")
  direct = parallel_data.encode_pairs(first.tokenizer, src, tgt, 48)
  np.testing.assert_array_equal(direct.targets.padded(np.arange(50), 48),
                                again.train.targets.padded(np.arange(50), 48))

  # A changed corpus gets a new cache, never the old one.
  tasks.load_task(numbers_data(count=2000), str(tmp_path))
  assert len([d for d in os.listdir(tmp_path / "tokenized") if not d.endswith(".lock")]) == 2
  assert cached in os.listdir(tmp_path / "tokenized")


@pytest.mark.parametrize("damage", ["overwritten with valid ids", "truncated",
                                    "ids outside the vocabulary"])
def test_a_changed_or_damaged_token_cache_is_named_and_rebuilt_never_trained_on(
    tmp_path, caplog, damage):
  """Every start checks the cache: each file against the digest written when it was
  built, the ids against the vocabulary (here with the digest rewritten to match, so
  that only that check can catch it). The damaged file is named in one line, the cache
  rebuilt, and what is trained on is what the corpus gives."""
  first = tasks.load_task(numbers_data(), str(tmp_path))
  expected = [np.array(first.train.targets[k]) for k in (0, 5, 1234)]  # Before damage.
  vocab_size = first.tokenizer.vocab_size
  del first  # Its memory map: the file is damaged in place.
  [cached] = [d for d in os.listdir(tmp_path / "tokenized") if not d.endswith(".lock")]
  path = tmp_path / "tokenized" / cached / "targets.tokens.bin"
  original = path.read_bytes()
  tokens = np.frombuffer(original, np.uint16).copy()
  if damage == "truncated":
    path.write_bytes(original[:-6])
  elif damage == "overwritten with valid ids":
    path.write_bytes(np.roll(tokens, 1).tobytes())  # Every id valid, in the wrong place.
  else:
    tokens[5] = vocab_size
    path.write_bytes(tokens.tobytes())
    meta = json.loads((path.parent / "meta.json").read_text())
    meta["digests"][path.name] = tokenized._digest(str(path))
    (path.parent / "meta.json").write_text(json.dumps(meta))
  caplog.set_level("INFO")
  again = tasks.load_task(numbers_data(), str(tmp_path))
  named = [r.getMessage() for r in caplog.records if "rebuilding" in r.getMessage()]
  assert len(named) == 1 and str(path) in named[0], caplog.text
  assert "tokenized the training split once" in caplog.text
  assert path.read_bytes() == original
  for k, row in zip((0, 5, 1234), expected):
    np.testing.assert_array_equal(row, again.train.targets[k])


def test_data_not_prepared_is_named_and_never_built_where_building_is_not_allowed(
    tmp_path, capsys):
  """What a process of a run of several does (build=False): a workdir without its
  tokenizer, or a tokenized split not built, is NotPrepared, in one message naming the
  missing file or folder, and nothing is written; once a process allowed to build has
  built them (saying so in one `data:` line), the same calls read them and say that."""
  corpus = corpora.corpus(numbers_data())
  with pytest.raises(NotPrepared, match=rf"the tokenizer is not prepared: {tmp_path}/"
                     r"tokenizer.model does not exist"):
    tasks.run_tokenizer(corpus, str(tmp_path), build=False)
  assert not os.listdir(tmp_path)
  first = tasks.load_task(numbers_data(), str(tmp_path))  # One process: builds.
  built = capsys.readouterr().out
  [name] = [d for d in os.listdir(tmp_path / "tokenized") if not d.endswith(".lock")]
  directory = str(tmp_path / "tokenized" / name)
  assert built.count("data: ") == 1 and re.search(
      rf"^data: process 0 of 1 built it here: the tokenizer {tmp_path}/tokenizer.model; "
      rf"the tokenized training split in {directory}$", built, re.M), built
  tok, trained = tasks.run_tokenizer(corpus, str(tmp_path), build=False)
  assert not trained and tok.vocab_size == first.tokenizer.vocab_size
  os.rename(directory, directory + ".aside")
  with pytest.raises(NotPrepared, match=rf"tokenized training split is not prepared in "
                     rf"{directory}$"):
    tokenized.load_or_build(directory, corpus.train_chunks(), tok, {}, build=False)
  assert not os.path.exists(directory)
  os.rename(directory + ".aside", directory)
  arrays, cache_built = tokenized.load_or_build(directory, corpus.train_chunks(), tok, {},
                                                build=False)
  with open(os.path.join(directory, "meta.json")) as f:
    assert not cache_built and len(arrays["inputs"][1]) == json.load(f)["pairs"]
  capsys.readouterr()
  tasks.load_task(numbers_data(), str(tmp_path))
  assert re.fullmatch(r"data: process 0 of 1 read what was prepared, building nothing: "
                      rf"the tokenizer {tmp_path}/tokenizer.model; the tokenized training "
                      rf"split in {directory}\n", capsys.readouterr().out)


def test_a_sweep_prepares_its_data_once_and_every_run_shares_it(tmp_path, caplog):
  """main --prepare_data writes the tokenizer and the tokenized split; a run given them
  through data.tokenizer_file and data.cache_dir trains and tokenizes nothing."""
  prep = tmp_path / "prep"
  out = subprocess.run(
      [sys.executable, "-m", "transformer_jax.main", "--config=configs/transformer.py:numbers",
       f"--workdir={prep}", "--prepare_data", "--config.data.num_train_examples=3000",
       "--config.data.num_eval_examples=32", "--config.data.tokenizer_sentences=20000",
       "--config.data.vocab_size=100", "--config.data.max_length=48"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  prepared = re.search(r"^prepared numbers: (\d+) training pairs; tokenizer ", out.stdout,
                       re.M)
  assert prepared and f"data: process 0 of 1 built it here: the tokenizer {prep}" \
      in out.stdout, out.stdout
  assert not (prep / "checkpoints").exists()  # Nothing trained.
  shared = numbers_data(tokenizer_file=str(prep / "tokenizer.model"),
                    cache_dir=str(prep / "tokenized"), vocab_size=200)  # The file's wins.
  caplog.set_level("INFO")
  task = tasks.load_task(shared, str(tmp_path / "run"))
  assert "tokenized" not in caplog.text and len(task.train) == int(prepared[1])
  assert task.tokenizer.vocab_size == 100
  assert ((tmp_path / "run" / "tokenizer.model").read_bytes() ==
          (prep / "tokenizer.model").read_bytes())
  with pytest.raises(ValueError, match=r"data.tokenizer_file=\S+missing.model: no such file"):
    tasks.load_task(numbers_data(tokenizer_file=str(tmp_path / "missing.model")),
                    str(tmp_path / "other"))
