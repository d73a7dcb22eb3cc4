"""Corpora (transformer_jax/data/corpora.py, the datasets in data/datasets/): text files,
TFDS, Multi30k's release, and bad files named by file and line."""

import os
import re

import pytest
import tensorflow_datasets as tfds

from conftest import multi30k_standin, MULTI30K_STANDIN_SIZES, write_lines
from transformer_jax.config import DataConfig, NotPrepared
from transformer_jax.data import corpora, tasks
from transformer_jax.data.datasets import multi30k
from transformer_jax.data.datasets.multi30k import release
from transformer_jax.data.datasets.text import TextFiles
from transformer_jax.data.datasets.tfds import TfdsDataset


@pytest.fixture
def multi30k_manual(tmp_path, monkeypatch):
  """A Multi30k manual directory of generated pairs, with checksums.tsv's sums
  replaced by theirs: the real builder, offline, without the real files."""
  manual = tmp_path / "manual"
  sums = multi30k_standin(manual)
  monkeypatch.setattr(release, "sha256", lambda: sums)
  return manual


def test_text_files_load_with_gzip_and_empty_pairs_dropped(tmp_path):
  src = write_lines(tmp_path / "train.en.gz", ["a cat", "", "a dog", "two birds"])
  tgt = write_lines(tmp_path / "train.de", ["eine Katze", "leer", "ein Hund", " "])
  cfg = DataConfig(task="text", train_files=f"{src},{tgt}", eval_files=f"{src},{tgt}")
  assert corpora.corpus(cfg).split("train") == (["a cat", "a dog"], ["eine Katze", "ein Hund"])
  assert len(corpora.corpus(cfg).split("eval")[0]) == 4  # Evaluation sets stay whole.


def test_parallel_files_of_different_lengths_are_rejected_naming_both(tmp_path):
  src = write_lines(tmp_path / "a.en", ["one", "two", "three"])
  tgt = write_lines(tmp_path / "a.de", ["eins", "zwei"])
  with pytest.raises(ValueError, match=rf"{src} has 3 lines, {tgt} has 2"):
    corpora.read_parallel_files(src, tgt)


def test_undecodable_bytes_are_reported_with_file_and_line(tmp_path):
  path = str(tmp_path / "bad.de")
  with open(path, "wb") as f:
    f.write(b"gut\nschlecht \xff\xfe\n")
  with pytest.raises(ValueError, match=rf"{path}:2: not valid UTF-8"):
    corpora.read_lines(path)


def test_text_task_requires_its_files():
  with pytest.raises(ValueError, match="config.data.train_files"):
    DataConfig(task="text")


@pytest.mark.parametrize("name,source,target", [
    ("wmt14_translate/de-en", "en", "de"), ("wmt14_translate/fr-en", "fr", "en"),
    ("wmt17_translate/de-en", "de", "en")])
def test_wmt_loads_through_tfds_in_either_direction(name, source, target):
  """Mock examples whose text names its language: the source side is the source
  language's sentence of the same example, in either direction."""
  import tensorflow as tf
  def as_dataset(self, *args, **kwargs):
    langs = self.info.supervised_keys
    return tf.data.Dataset.from_tensor_slices(
        {lang: [f"{lang} sentence {i}" for i in range(7)] for lang in langs})
  cfg = DataConfig(task="tfds", tfds_name=name, source_lang=source, target_lang=target)
  with tfds.testing.mock_data(num_examples=7, as_dataset_fn=as_dataset):
    src, tgt = corpora.corpus(cfg).split("test")
  assert src == [f"{source} sentence {i}" for i in range(7)]
  assert tgt == [f"{target} sentence {i}" for i in range(7)]


def test_tfds_rejects_a_language_the_dataset_lacks():
  cfg = DataConfig(task="tfds", tfds_name="wmt14_translate/de-en", target_lang="fr")
  with tfds.testing.mock_data(num_examples=2), pytest.raises(ValueError, match="'fr'"):
    corpora.corpus(cfg).split("eval")


def test_multi30k_builds_offline_from_the_manual_directory(tmp_path, multi30k_manual):
  """The TFDS builder, given the six files as its manual directory, and the commands'
  own reading of them as text files (no TensorFlow) give the same pairs."""
  cfg = DataConfig(task="multi30k", manual_dir=str(multi30k_manual),
                   tfds_data_dir=str(tmp_path / "tfds"))
  sizes = {split: len(corpora.corpus(cfg).split(split)[0]) for split in ("eval", "test")}
  assert sizes == {"eval": MULTI30K_STANDIN_SIZES["val"],
                   "test": MULTI30K_STANDIN_SIZES["test_2016_flickr"]}
  for split in ("train", "eval"):  # The builder's own: the same files through TFDS.
    src, tgt = corpora.corpus(cfg).split(split)
    built = multi30k.Multi30k(cfg).whole(split)
    assert sorted(zip(src, tgt)) == sorted(zip(*built))  # Every pair (TFDS shuffles).


def test_a_tfds_dataset_is_built_only_where_building_is_allowed_then_read(
    tmp_path, multi30k_manual):
  """Multi30k's TFDS builder as data.tfds_name: a process that may not build finds it
  NotPrepared, naming the folder, and writes nothing there; one that may builds it
  once; after that both read it."""
  cfg = DataConfig(task="tfds", tfds_name="multi30k", manual_dir=str(multi30k_manual),
                   tfds_data_dir=str(tmp_path / "tfds"))
  where = f"the TFDS dataset multi30k in {tmp_path}/tfds/multi30k/1.0.0"
  with pytest.raises(NotPrepared, match=f"multi30k is not prepared in {tmp_path}/tfds/"):
    corpora.corpus(cfg).prepare(build=False)
  assert not list((tmp_path / "tfds").glob("multi30k/*/*.json"))
  assert corpora.corpus(cfg).prepare(build=True) == (True, where)
  assert corpora.corpus(cfg).prepare(build=False) == (False, where)
  assert corpora.corpus(cfg).prepare(build=True) == (False, where)


def test_a_tfds_tasks_test_split_can_come_from_files(tmp_path, multi30k_manual):
  """data.test_files replaces a TFDS dataset's test split (newstest2014 from sacreBLEU
  beside WMT14 or Multi30k from TFDS), named by its file; the other splits stay the
  dataset's. A task that reads no files refuses them."""
  en = write_lines(tmp_path / "newstest2014.en", ["a house", "two"])
  de = write_lines(tmp_path / "newstest2014.de", ["ein Haus", "zwei"])
  cfg = DataConfig(task="tfds", tfds_name="wmt14_translate/de-en", test_files=f"{en},{de}")
  with tfds.testing.mock_data(num_examples=3):
    corpus = corpora.corpus(cfg)
    assert corpus.split("test") == (["a house", "two"], ["ein Haus", "zwei"])
    assert corpus.test_set() == "newstest2014" and len(corpus.split("eval")[0]) == 3
  multi = corpora.corpus(DataConfig(task="multi30k", manual_dir=str(multi30k_manual),
                                    test_files=f"{en},{de}"))
  assert multi.split("test")[0] == ["a house", "two"] and multi.test_set() == "newstest2014"
  with pytest.raises(ValueError, match=r"config.data.test_files=.*'' for data.task='numbers'"):
    DataConfig(task="numbers", test_files=f"{en},{de}")


def test_a_run_resolves_its_corpus_once_and_hashes_each_file_once(tmp_path,
                                                                  multi30k_manual,
                                                                  monkeypatch):
  """Multi30k from its plain files: preflight checks each of the six files against the
  release's sums once, and the run (tokenizer, token cache, held-out sets, BLEU) reads
  what it resolved; a resume checks them once again."""
  from configs import transformer as configs
  from transformer_jax.training import loop
  checked = []
  verified = release.verified
  monkeypatch.setattr(release, "verified", lambda path: checked.append(path) or
                      verified(path))
  config = configs.get_config("multi30k,smoke")
  config.data.manual_dir = str(multi30k_manual)
  config.train.num_train_steps = 2
  loop.train_and_evaluate(config, str(tmp_path / "run"))
  assert sorted(os.path.basename(p) for p in checked) == sorted(release.file_names())
  checked.clear()
  loop.train_and_evaluate(config, str(tmp_path / "run"))  # Finished: it says so.
  assert len(checked) == 6


def test_multi30k_rejects_a_file_whose_checksum_differs(tmp_path, multi30k_manual):
  write_lines(multi30k_manual / "val.de.gz", ["falsch"])
  cfg = DataConfig(task="multi30k", manual_dir=str(multi30k_manual),
                   tfds_data_dir=str(tmp_path / "tfds"))
  with pytest.raises(ValueError, match=r"val\.de\.gz: SHA-256 .* does not match"):
    corpora.corpus(cfg).split("train")
  with pytest.raises(ValueError, match=r"val\.de\.gz: SHA-256 .* does not match"):
    multi30k.Multi30k(cfg).whole("train")
  (multi30k_manual / "val.de.gz").unlink()
  with pytest.raises(ValueError, match=r"manual_dir=.* lacks val\.de\.gz \("):
    corpora.corpus(cfg).check_available()


@pytest.mark.parametrize("size", ["base", "big"])
def test_paper_configs_load_wmt14_through_tfds(size, tmp_path):
  from configs import transformer as configs
  from transformer_jax import config as config_lib
  cfg = config_lib.parse(configs.get_config(size))
  assert (cfg.data.task, cfg.data.tfds_name, cfg.data.source_lang, cfg.data.target_lang,
          cfg.data.eval_split, cfg.data.test_split) == (
              "tfds", "wmt14_translate/de-en:1.0.0", "en", "de", "validation", "test")
  small = DataConfig(**{**cfg.data.__dict__, "vocab_size": 60})  # Mock text is tiny.
  with tfds.testing.mock_data(num_examples=30):
    task = tasks.load_task(small, str(tmp_path))
  assert len(task.train) > 0 and len(task.eval_sources) == 30
  assert os.path.exists(tmp_path / "tokenizer.model")


def test_every_shipped_tfds_dataset_is_pinned_to_a_version_tfds_builds():
  """NAME/CONFIG:VERSION in every shipped config that reads TFDS, so that a newer TFDS
  with another version of WMT14 is not silently other text; the installed TFDS builds
  that version (nothing downloaded)."""
  from configs import transformer as configs
  from transformer_jax import config as config_lib
  pinned = 0
  for size in configs.SIZES:
    data = config_lib.parse(configs.get_config(size)).data
    if data.task == "tfds":
      name, _, version = data.tfds_name.partition(":")
      assert re.fullmatch(r"\d+\.\d+\.\d+", version), (size, data.tfds_name)
      assert str(tfds.builder(data.tfds_name).info.version) == version
      pinned += 1
  assert pinned == 4  # base, big, base_enfr, big_enfr.


@pytest.mark.parametrize("size", ["base", "big", "base_enfr", "big_enfr"])
def test_wmt14s_test_split_is_newstest2014_and_the_final_line_names_it(size):
  """Table 2's test set: at the version the config pins, TFDS's WMT14 builder makes the
  config's test split of newstest2014 alone, and the final line's name for it comes
  from the builder, so another split (here the eval split) is named as what it is."""
  from configs import transformer as configs
  from transformer_jax import config as config_lib
  data = config_lib.parse(configs.get_config(size)).data
  assert tfds.builder(data.tfds_name).subsets[data.test_split] == ["newstest2014"]
  assert corpora.corpus(data).test_set() == "newstest2014"
  other = DataConfig(**{**data.__dict__, "test_split": data.eval_split})
  assert corpora.corpus(other).test_set() == "newstest2013"

def test_the_papers_figure_is_given_for_its_test_set_alone(tmp_path):
  """Table 2's BLEU beside a run's own where its test set is newstest2014 (here from
  files, as docs/paper.md's rehearsal reads it), for the config's row and language
  pair; another test set, or a dataset without one, has no figure from the paper."""
  def text(name: str, **fields) -> DataConfig:
    pair = ",".join(write_lines(tmp_path / f"{name}.{lang}", ["a", "b"])
                    for lang in ("en", "de"))
    return DataConfig(task="text", train_files=pair, eval_files=pair, test_files=pair,
                      **fields)
  newstest = corpora.corpus(text("newstest2014"))
  assert (newstest.paper_figure("base"), newstest.paper_figure("big"),
          newstest.paper_figure("")) == (27.3, 28.4, None)
  assert corpora.corpus(text("newstest2014", target_lang="fr")).paper_figure("base") == 38.1
  assert corpora.corpus(text("newstest2013")).paper_figure("base") is None
  assert corpora.corpus(DataConfig(task="numbers")).paper_figure("base") is None


def test_translate_reads_lines_as_they_arrive_split_on_newlines_only():
  """Form feeds and Unicode line separators stay inside a line (str.splitlines would
  split there), so translate's output lines up with its input; a line is handed on as
  soon as it is complete, before the input ends."""
  read, write = os.pipe()
  chunks = corpora.line_chunks(read, max_lines=3)
  os.write(write, b"first\nsecond, still typ")
  assert next(chunks) == [b"first"]  # Returned while the writer is still open.
  os.write(write, "ing\na\x0cb\n\nc\r\nd\u2028e\x85f".encode())
  os.close(write)
  rest = [line for chunk in chunks for line in chunk]
  assert [corpora.decode_line(r) for r in rest] == [
      "second, still typing", "a\x0cb", "", "c", "d\u2028e\x85f"]


def test_text_corpus_changes_are_detected(tmp_path):
  src = write_lines(tmp_path / "a.en", ["one cat", "two dogs"])
  tgt = write_lines(tmp_path / "a.de", ["eine Katze", "zwei Hunde"])
  cfg = DataConfig(task="text", train_files=f"{src},{tgt}", eval_files=f"{src},{tgt}")
  before = corpora.corpus(cfg).identity()
  write_lines(tmp_path / "a.en", ["one cat", "three dogs"])
  assert corpora.corpus(cfg).identity() != before


def test_each_corpus_kind_names_itself_as_token_caches_were_keyed(tmp_path, multi30k_manual):
  """The identity each kind of corpus gives (the token cache's key, tokenized.fingerprint)
  is the one earlier caches were built under, so a cache made before still matches."""
  assert corpora.corpus(DataConfig(task="numbers", num_train_examples=300,
                                   num_eval_examples=20)).identity() == {
      "task": "numbers", "train": 300, "held_out": 20}
  write_lines(tmp_path / "a.en", ["a cat"])
  write_lines(tmp_path / "a.de", ["eine Katze"])
  text = corpora.corpus(DataConfig(task="text", train_files=f"{tmp_path}/a.en,{tmp_path}/a.de",
                                   eval_files=f"{tmp_path}/a.en,{tmp_path}/a.de"))
  assert isinstance(text, TextFiles)
  assert text.identity() == {"task": "text", "files": [
      [str(tmp_path / n), os.path.getsize(tmp_path / n), int(os.path.getmtime(tmp_path / n))]
      for n in ("a.en", "a.de")]}
  plain = corpora.corpus(DataConfig(task="multi30k", manual_dir=str(multi30k_manual)))
  assert isinstance(plain, TextFiles)  # Its plain files, read as text files.
  assert [f[0] for f in plain.identity()["files"]] == [
      str(multi30k_manual / "train.en.gz"), str(multi30k_manual / "train.de.gz")]
  wmt = corpora.corpus(DataConfig(task="tfds", tfds_name="wmt14_translate/de-en"))
  assert isinstance(wmt, TfdsDataset) and wmt.name == "wmt14_translate/de-en"
