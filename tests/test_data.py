"""Data: sources, bad input, packing, process shards and evaluation scores."""

import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
import sacrebleu
import tensorflow_datasets as tfds

from conftest import MULTI30K_STANDIN_SIZES, ROOT, multi30k_standin, toy_data, write_lines
from transformer_jax import config as config_lib, partitioning
from transformer_jax.config import DataConfig, TrainConfig
from transformer_jax.data import batching, buckets, corpora, multi30k, parallel_data
from transformer_jax.data import pretokenize, tasks, tokenizer
from transformer_jax.inference import bleu, restore
from transformer_jax.training import run_ahead



@pytest.fixture
def multi30k_manual(tmp_path, monkeypatch):
  """A Multi30k manual directory of generated pairs, with checksums.tsv's sums
  replaced by theirs: the real builder, offline, without the real files."""
  manual = tmp_path / "manual"
  sums = multi30k_standin(manual)
  monkeypatch.setattr(multi30k, "sha256", lambda: sums)
  return manual


def test_text_files_load_with_gzip_and_empty_pairs_dropped(tmp_path):
  src = write_lines(tmp_path / "train.en.gz", ["a cat", "", "a dog", "two birds"])
  tgt = write_lines(tmp_path / "train.de", ["eine Katze", "leer", "ein Hund", " "])
  cfg = DataConfig(task="text", train_files=f"{src},{tgt}", eval_files=f"{src},{tgt}")
  assert corpora.load_split(cfg, "train") == (["a cat", "a dog"], ["eine Katze", "ein Hund"])
  assert len(corpora.load_split(cfg, "eval")[0]) == 4  # Evaluation sets stay whole.


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


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory):
  words = ["a cat sat on the mat", "ein Hund lief", "two birds and a fish", "zwei Vögel"] * 50
  path = str(tmp_path_factory.mktemp("tok") / "spm.model")
  return tokenizer.load_or_train(path, words, 40, "bpe")


def test_tokenizer_round_trips_and_ends_with_eos(tiny_tokenizer):
  ids = tiny_tokenizer.encode(["zwei Vögel und ein Hund"])[0]
  assert ids[-1] == tokenizer.EOS_ID and tokenizer.PAD_ID not in ids
  assert tiny_tokenizer.decode(ids + [0, 0]) == "zwei Vögel und ein Hund"


@pytest.mark.parametrize("overlong,kept,longest", [("drop", 1, 6), ("truncate", 2, 6)])
def test_overlong_pairs_are_dropped_or_truncated(tiny_tokenizer, overlong, kept, longest):
  src = ["a cat", "a cat sat on the mat and two birds and a fish"]
  data = parallel_data.encode_pairs(tiny_tokenizer, src, src, 6, overlong=overlong)
  assert len(data) == kept
  assert max(len(x) for x in data.inputs) <= longest
  assert all(x[-1] == tokenizer.EOS_ID for x in data.inputs)


def test_packed_rows_have_segments_and_positions():
  seqs = [np.array([5, 6, 1]), np.array([7, 1]), np.array([8, 9, 9, 1])]
  data = parallel_data.ParallelData(seqs, seqs)
  batch = batching.train_batch(data, 0, TrainConfig(batching="packed", batch_size=2), 8)
  tokens, segments = batch["inputs"], batch["inputs_segmentation"]
  for row in range(2):  # Every example appears once; positions restart per segment.
    for seg in set(segments[row]) - {0}:
      where = segments[row] == seg
      assert list(batch["inputs_positions"][row][where]) == list(range(where.sum()))
  real = sorted(tuple(tokens[r][segments[r] == s]) for r in range(2)
                for s in set(segments[r]) - {0})
  assert real == sorted(tuple(s) for s in seqs)
  np.testing.assert_array_equal(batch["targets_segmentation"], segments)


@pytest.mark.parametrize("mode", ["tokens", "packed", "sentences"])
def test_a_resumed_stream_sees_the_same_batches(mode):
  """Exact resume: batch k depends on (data, seed, k) only, across epochs too."""
  data = toy_data(60)
  cfg = TrainConfig(batching=mode, batch_size=8, batch_tokens=256, seed=5)
  uninterrupted = [batching.train_batch(data, k, cfg, 32, 2) for k in range(30)]
  batching.clear_caches()  # As in a fresh process.
  resumed = [batching.train_batch(data, k, cfg, 32, 2) for k in range(12, 30)]
  for a, b in zip(uninterrupted[12:], resumed):
    assert a.keys() == b.keys()
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])
  assert not np.array_equal(uninterrupted[0]["inputs"], uninterrupted[1]["inputs"])


def test_each_process_gets_a_disjoint_share_of_the_global_batch():
  batch = {"inputs": np.arange(16).reshape(8, 2)}
  shares = [partitioning.local_rows(batch, p, 4)["inputs"] for p in range(4)]
  np.testing.assert_array_equal(np.concatenate(shares), batch["inputs"])
  with pytest.raises(ValueError, match="does not split over 3 processes"):
    partitioning.local_rows(batch, 0, 3)


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
    src, tgt = corpora.load_split(cfg, "test")
  assert src == [f"{source} sentence {i}" for i in range(7)]
  assert tgt == [f"{target} sentence {i}" for i in range(7)]


def test_tfds_rejects_a_language_the_dataset_lacks():
  cfg = DataConfig(task="tfds", tfds_name="wmt14_translate/de-en", target_lang="fr")
  with tfds.testing.mock_data(num_examples=2), pytest.raises(ValueError, match="'fr'"):
    corpora.load_split(cfg, "eval")


def test_multi30k_builds_offline_from_the_manual_directory(tmp_path, multi30k_manual):
  """The TFDS builder, given the six files as its manual directory, and the commands'
  own reading of them as text files (no TensorFlow) give the same pairs."""
  cfg = DataConfig(task="multi30k", manual_dir=str(multi30k_manual),
                   tfds_data_dir=str(tmp_path / "tfds"))
  sizes = {split: len(corpora.load_split(cfg, split)[0]) for split in ("eval", "test")}
  assert sizes == {"eval": MULTI30K_STANDIN_SIZES["val"],
                   "test": MULTI30K_STANDIN_SIZES["test_2016_flickr"]}
  for split, tfds_split in (("train", "train"), ("eval", "validation")):
    src, tgt = corpora.load_split(cfg, split)
    built = corpora._tfds_pairs("multi30k", tfds_split, cfg)
    assert sorted(zip(src, tgt)) == sorted(zip(*built))  # Every pair (TFDS shuffles).


def test_a_run_resolves_its_corpus_once_and_hashes_each_file_once(tmp_path,
                                                                  multi30k_manual,
                                                                  monkeypatch):
  """Multi30k from its plain files: preflight checks each of the six files against the
  release's sums once, and the run (tokenizer, token cache, held-out sets, BLEU) reads
  what it resolved; a resume checks them once again."""
  from configs import transformer as configs
  from transformer_jax.training import loop
  checked = []
  verified = multi30k.verified
  monkeypatch.setattr(multi30k, "verified", lambda path: checked.append(path) or
                      verified(path))
  config = configs.get_config("multi30k,smoke")
  config.data.manual_dir = str(multi30k_manual)
  config.train.num_train_steps = 2
  loop.train_and_evaluate(config, str(tmp_path / "run"))
  assert sorted(os.path.basename(p) for p in checked) == sorted(multi30k.file_names())
  checked.clear()
  loop.train_and_evaluate(config, str(tmp_path / "run"))  # Finished: it says so.
  assert len(checked) == 6


def test_multi30k_rejects_a_file_whose_checksum_differs(tmp_path, multi30k_manual):
  write_lines(multi30k_manual / "val.de.gz", ["falsch"])
  cfg = DataConfig(task="multi30k", manual_dir=str(multi30k_manual),
                   tfds_data_dir=str(tmp_path / "tfds"))
  with pytest.raises(ValueError, match=r"val\.de\.gz: SHA-256 .* does not match"):
    corpora.load_split(cfg, "train")
  with pytest.raises(ValueError, match=r"val\.de\.gz: SHA-256 .* does not match"):
    corpora._tfds_pairs("multi30k", "train", cfg)
  (multi30k_manual / "val.de.gz").unlink()
  with pytest.raises(ValueError, match=r"manual_dir=.* lacks val\.de\.gz \("):
    corpora.check_available(cfg)


def test_packing_fills_rows():
  """Pairs of 1 to 28 tokens (mean 15) in rows of 64: packing fills at least 80% of the
  rows with real tokens (84% measured), over three times what one pair per row does."""
  data = toy_data(2000)
  fill = lambda mode: np.mean([
      (batching.train_batch(data, k, TrainConfig(batching=mode, batch_size=64), 64)
       ["targets"] != 0).mean() for k in range(20)])
  packed, one_per_row = fill("packed"), fill("sentences")
  assert packed >= 0.8 and packed > 3 * one_per_row, (packed, one_per_row)


def _fairseq_bleu4(hypotheses, references):
  """fairseq's BLEU4 (fairseq/bleu.py and clib/libbleu in Wu et al.'s fork): clipped
  n-gram matches on whitespace tokens, summed over the corpus; no smoothing; brevity
  min(1, exp(1 - reflen / predlen))."""
  stats = np.zeros((4, 2))
  reflen = predlen = 0
  for hyp, ref in zip(hypotheses, references):
    hyp, ref = hyp.split(), ref.split()
    reflen, predlen = reflen + len(ref), predlen + len(hyp)
    for n in range(1, 5):
      grams = lambda words: [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
      counts = {g: grams(hyp).count(g) for g in grams(hyp)}
      stats[n - 1] += [sum(min(c, grams(ref).count(g)) for g, c in counts.items()),
                       len(grams(hyp))]
  return 100 * min(1, np.exp(1 - reflen / predlen)) * np.exp(
      np.mean(np.log(stats[:, 0] / stats[:, 1])))


def test_lowercase_bleu_is_fairseqs_bleu4_on_multi30k_papers_tokens():
  """The Multi30k literature's score: lowercased, normalized, Moses-tokenized text (as
  Wu et al.'s data), then BLEU4 on the tokens. By hand: 7/8 unigrams, 5/7 bigrams, 3/6
  trigrams and 2/5 4-grams match, equal lengths: 100 (1/8)^(1/4) = 59.46."""
  hyp, ref = ["Ein Hund läuft schnell über die Wiese."], ["ein hund rennt schnell über die wiese ."]
  scores = bleu.score_translations(hyp, ref)
  assert scores["lowercase_bleu"] == pytest.approx(100 * 8 ** -0.25)
  tokens = lambda texts: [pretokenize.moses_lowercase(t, "de") for t in texts]
  assert _fairseq_bleu4(tokens(hyp), tokens(ref)) == pytest.approx(100 * 8 ** -0.25)
  assert scores["bleu"] < 30.0  # The headline score stays cased.
  quoted = ["Er sagt: „Guten Morgen“ & geht."]  # Normalized and escaped alike.
  assert bleu.lowercase_bleu(quoted, ['er sagt : " guten morgen " & geht .']) == pytest.approx(100)


def test_moses_lowercase_prepares_each_side_in_its_language_and_translations_are_text(
    tmp_path):
  """data.pretokenize="moses_lowercase" (Wu et al.'s preprocessing): SentencePiece learns
  lowercased Moses tokens of each side (English splits "kid's" as "kid 's", German as
  "kid ' s"), the cached training split is of those tokens, and decoding gives plain
  text back."""
  en = ["A kid's table.", "Two dogs & a cat play in the snow."] * 20
  de = ["Ein Mann hält ein Schild: „Guten Morgen“.", "Zwei Hunde spielen im Schnee."] * 20
  files = f"{write_lines(tmp_path / 'train.en', en)},{write_lines(tmp_path / 'train.de', de)}"
  raw = DataConfig(task="text", train_files=files, eval_files=files, vocab_size=60)
  cfg = DataConfig(**{**raw.__dict__, "pretokenize": "moses_lowercase"})
  task = tasks.load_task(cfg, str(tmp_path / "run"))
  tok = task.tokenizer
  assert not any(c.isupper() for piece in tok.pieces() for c in piece)
  as_text = lambda ids: "".join(tok.pieces()[i] for i in ids[:-1]).replace("▁", " ")
  assert as_text(task.train.inputs[0]).strip() == "a kid &apos;s table ."
  assert as_text(tok.encode(["A kid's table."], target=True)[0]).strip() == (
      "a kid &apos; s table .")
  assert as_text(task.train.targets[0]).strip() == (
      "ein mann hält ein schild : &quot; guten morgen &quot; .")
  assert tok.decode(task.train.targets[0]) == 'ein mann hält ein schild: "guten morgen".'
  assert task.eval_references[0] == de[0]  # BLEU scores against the text as it is.
  plain = tasks.load_task(raw, str(tmp_path / "raw"))  # Another cache directory.
  assert os.listdir(tmp_path / "run" / "tokenized") != os.listdir(tmp_path / "raw" / "tokenized")
  assert any(c.isupper() for piece in plain.tokenizer.pieces() for c in piece)


def test_bleu_lc_is_sacrebleus_lowercased_score_of_the_text():
  """A lowercased translation of a cased reference: bleu (cased) counts its nouns
  wrong, bleu_lc (sacreBLEU's -lc) counts them right."""
  ref = ["Ein Mann fährt Fahrrad auf der Straße."]
  hyp = [ref[0].lower()]
  scores = bleu.score_translations(hyp, ref)
  assert scores["bleu_lc"] == pytest.approx(100)
  assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyp, [ref]).score)
  assert scores["bleu"] < 50
  assert scores["bleu_lc"] == pytest.approx(
      sacrebleu.corpus_bleu(hyp, [ref], lowercase=True).score)


def test_paper_bleu_splits_compounds_and_scores_above_sacrebleu_on_hyphens():
  """tensor2tensor's get_ende_bleu.sh: Moses tokens, then "a-b" -> "a ##AT##-##AT## b",
  so a half-right compound earns n-grams that sacreBLEU's 13a (which keeps it whole)
  does not give."""
  hyp = ["Die Nord-Süd-Verbindung ist heute offen."]
  ref = ["Die Nord-Süd-Strecke ist heute offen."]
  scores = bleu.score_translations(hyp, ref)
  split = sacrebleu.corpus_bleu(
      ["Die Nord ##AT##-##AT## Süd ##AT##-##AT## Verbindung ist heute offen ."],
      [["Die Nord ##AT##-##AT## Süd ##AT##-##AT## Strecke ist heute offen ."]],
      tokenize="none")
  whole = sacrebleu.corpus_bleu(["Die Nord-Süd-Verbindung ist heute offen ."],
                                [["Die Nord-Süd-Strecke ist heute offen ."]], tokenize="none")
  assert scores["paper_bleu"] == pytest.approx(split.score)
  assert scores["paper_bleu"] > whole.score + 5
  assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyp, [ref]).score)
  assert scores["paper_bleu"] > scores["bleu"] + 5
  assert "tok:13a" in scores["signature"] and scores["exact_match"] == 0.0


def test_average_last_n_averages_the_last_n_of_the_kept_checkpoints(tmp_path):
  """Sec. 6.1 averages the last checkpoints: of four kept (every parameter equal to its
  step, saved and restored through Orbax), --average_last=2 is the mean of the last two,
  and with --step=30 of the two up to it."""
  import flax.linen as nn
  import orbax.checkpoint as ocp
  from conftest import smoke_config
  from transformer_jax.model.transformer import Transformer, init_params
  from transformer_jax import checkpoint
  cfg = smoke_config()
  model = Transformer(cfg.model)
  shapes = nn.meta.unbox(jax.eval_shape(lambda: init_params(model, jax.random.key(0))))
  mngr = checkpoint.manager(str(tmp_path), keep=10)
  for step in (10, 20, 30, 40):
    params = jax.tree.map(lambda x: np.full(x.shape, step, x.dtype), shapes)
    mngr.save(step, args=ocp.args.StandardSave({"params": params, "step": step}))
  mngr.wait_until_finished()
  trained = restore.TrainedModel(str(tmp_path), cfg, None, model)
  for average_last, step, mean in ((2, None, 35.0), (3, None, 30.0), (2, 30, 25.0),
                                   (1, None, 40.0)):
    steps = restore.checkpoint_steps(str(tmp_path), average_last, step)
    assert steps == [s for s in (10, 20, 30, 40) if s <= (step or 40)][-average_last:]
    for leaf in jax.tree.leaves(restore.average_checkpoints(trained, steps)):
      np.testing.assert_allclose(np.asarray(leaf), mean, rtol=1e-6)


@pytest.mark.parametrize("size", ["base", "big"])
def test_paper_configs_load_wmt14_through_tfds(size, tmp_path):
  from configs import transformer as configs
  from transformer_jax import config as config_lib
  cfg = config_lib.parse(configs.get_config(size))
  assert (cfg.data.task, cfg.data.tfds_name, cfg.data.source_lang, cfg.data.target_lang,
          cfg.data.eval_split, cfg.data.test_split) == (
              "tfds", "wmt14_translate/de-en", "en", "de", "validation", "test")
  small = DataConfig(**{**cfg.data.__dict__, "vocab_size": 60})  # Mock text is tiny.
  with tfds.testing.mock_data(num_examples=30):
    task = tasks.load_task(small, str(tmp_path))
  assert len(task.train) > 0 and len(task.eval_sources) == 30
  assert os.path.exists(tmp_path / "tokenizer.model")


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


# --- at WMT scale: tokenize once, memory-map, plan epochs with numpy ----------

def _numbers(count=3000, **overrides):
  overrides = {"tokenizer_sentences": 20_000, "vocab_size": 100, **overrides}
  return DataConfig(task="numbers", max_length=48, num_train_examples=count,
                    num_eval_examples=32, **overrides)


def test_the_training_split_is_tokenized_once_then_memory_mapped(tmp_path, caplog):
  caplog.set_level("INFO")
  first = tasks.load_task(_numbers(), str(tmp_path))
  assert "tokenized the training split once" in caplog.text
  [cached] = os.listdir(tmp_path / "tokenized")[:1]
  caplog.clear()
  again = tasks.load_task(_numbers(), str(tmp_path))  # A restart.
  assert "tokenized" not in caplog.text
  assert isinstance(again.train.inputs.tokens, np.memmap)
  for k in (0, 7, 123):
    for a, b in [(first.train.inputs, again.train.inputs),
                 (first.train.targets, again.train.targets)]:
      np.testing.assert_array_equal(a[k], b[k])
  # The same ids as tokenizing in memory.
  src, tgt = corpora.load_split(_numbers(), "train")
  direct = parallel_data.encode_pairs(first.tokenizer, src, tgt, 48)
  np.testing.assert_array_equal(direct.targets.padded(np.arange(50), 48),
                                again.train.targets.padded(np.arange(50), 48))

  # A changed corpus gets a new cache, never the old one.
  tasks.load_task(_numbers(count=2000), str(tmp_path))
  assert len([d for d in os.listdir(tmp_path / "tokenized") if not d.endswith(".lock")]) == 2
  assert cached in os.listdir(tmp_path / "tokenized")


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
  prepared = re.match(r"prepared numbers: (\d+) training pairs; tokenizer ", out.stdout)
  assert prepared, out.stdout
  assert not (prep / "checkpoints").exists()  # Nothing trained.
  shared = _numbers(tokenizer_file=str(prep / "tokenizer.model"),
                    cache_dir=str(prep / "tokenized"), vocab_size=200)  # The file's wins.
  caplog.set_level("INFO")
  task = tasks.load_task(shared, str(tmp_path / "run"))
  assert "tokenized" not in caplog.text and len(task.train) == int(prepared[1])
  assert task.tokenizer.vocab_size == 100
  assert ((tmp_path / "run" / "tokenizer.model").read_bytes() ==
          (prep / "tokenizer.model").read_bytes())
  with pytest.raises(ValueError, match=r"data.tokenizer_file=\S+missing.model: no such file"):
    tasks.load_task(_numbers(tokenizer_file=str(tmp_path / "missing.model")),
                    str(tmp_path / "other"))


def test_text_corpus_changes_are_detected(tmp_path):
  src = write_lines(tmp_path / "a.en", ["one cat", "two dogs"])
  tgt = write_lines(tmp_path / "a.de", ["eine Katze", "zwei Hunde"])
  cfg = DataConfig(task="text", train_files=f"{src},{tgt}", eval_files=f"{src},{tgt}")
  before = corpora.identity(cfg)
  write_lines(tmp_path / "a.en", ["one cat", "three dogs"])
  assert corpora.identity(cfg) != before


def test_tokenizer_training_is_deterministic_across_processes(tmp_path):
  """The same corpus gives the same tokenizer in any process; here
  with sampling on (2,000 of 6,000 sentences), in two separate processes."""
  import subprocess, sys  # noqa: E401
  code = ("import sys; from transformer_jax.data import tasks; "
          "from transformer_jax.config import DataConfig; "
          "cfg = DataConfig(task='numbers', vocab_size=100, num_train_examples=3000, "
          "num_eval_examples=32, tokenizer_sentences=2000); "
          "tasks.run_tokenizer(cfg, sys.argv[1])")
  models = []
  for name in ("a", "b"):
    subprocess.run([sys.executable, "-c", code, str(tmp_path / name)], check=True,
                   cwd=ROOT, capture_output=True, timeout=300)
    models.append((tmp_path / name / "tokenizer.model").read_bytes())
  assert models[0] == models[1]
  sample = tasks.sample_sentences(_numbers(tokenizer_sentences=2000))
  assert len(sample) == 2000 and len(set(sample)) > 1500


def test_stored_sequences_pad_truncate_and_select():
  seqs = [np.array([5, 6, 1]), np.array([7, 1]), np.array([8, 9, 9, 9, 1])]
  stored = parallel_data.Sequences.from_list(seqs)
  np.testing.assert_array_equal(stored.padded([2, -1, 0], 6),
                                parallel_data.pad([seqs[2], np.zeros(0), seqs[0]], 6))
  np.testing.assert_array_equal(stored.clipped(3)[2], [8, 9, tokenizer.EOS_ID])
  np.testing.assert_array_equal(stored.select(np.array([1]))[0], seqs[1])


def test_length_buckets_are_bounded_and_waste_the_least_padding():
  import itertools
  rng = np.random.default_rng(1)
  lengths = np.minimum(rng.lognormal(3.0, 0.6, 5000).astype(int) + 2, 256)
  chosen = buckets.length_buckets(lengths, 4)
  needed = config_lib.round_up(lengths, 8)
  assert len(chosen) == 4 and chosen[-1] == needed.max() and all(chosen % 8 == 0)
  waste = lambda b: int((b[np.searchsorted(b, needed)] - needed).sum())
  values = np.unique(needed)
  best = min(waste(np.array(sorted(c) + [values[-1]]))
             for c in itertools.combinations(values[:-1], 3))
  assert waste(chosen) == best  # Exhaustive search agrees.
  few = np.array([8, 16, 16, 24])
  np.testing.assert_array_equal(buckets.length_buckets(few, 8), [8, 16, 24])


@pytest.mark.parametrize("mode", ["tokens", "packed", "sentences"])
def test_a_batch_holds_the_same_examples_on_any_number_of_devices(mode):
  """Elastic resume: the rows the devices need (data shards x microbatches) only append
  empty rows, fewer than that multiple, after the same examples in the same order."""
  data = toy_data(60)
  cfg = TrainConfig(batching=mode, batch_size=6, batch_tokens=200, seed=5)
  for k in range(25):  # Across epochs.
    alone = batching.train_batch(data, k, cfg, 32, row_multiple=1)
    rows = len(alone["inputs"])
    for multiple in (2, 4, 8, 16):
      placed = batching.train_batch(data, k, cfg, 32, row_multiple=multiple)
      assert len(placed["inputs"]) % multiple == 0
      assert len(placed["inputs"]) - rows < multiple
      for key, value in alone.items():
        np.testing.assert_array_equal(placed[key][:rows], value)
        assert not placed[key][rows:].any()


def test_token_budget_batch_k_needs_no_earlier_epoch():
  data = toy_data(500, max_len=60)
  cfg = TrainConfig(batch_tokens=512, seed=2, max_length_buckets=3)
  batching.clear_caches()
  per_epoch = batching._bucket_plan(data, 512, 3).batches_per_epoch
  batch = batching.train_batch(data, 7 * per_epoch + 3, cfg, 64)
  assert batching._token_budget_epoch.cache_info().misses == 1  # Epoch 7 alone.
  shapes = batching.train_batch_shapes(data, cfg, 64)
  assert len(shapes) == 3 and batch["inputs"].shape in [s["inputs"] for s in shapes]


def test_prefetched_batches_equal_the_direct_stream_and_stop_cleanly():
  import threading
  data = toy_data(200)
  cfg = TrainConfig(batch_tokens=256, seed=1)
  make = lambda k: batching.train_batch(data, k, cfg, 32)
  direct = [make(k) for k in range(40)]
  for a, b in zip(direct, run_ahead.prefetch(make, range(40), depth=3)):
    np.testing.assert_array_equal(a["inputs"], b["inputs"])

  stream = run_ahead.prefetch(make, range(10**9), depth=2)  # Stopped early.
  next(stream)
  stream.close()
  assert not any(t.name == "prefetch" and t.is_alive() for t in threading.enumerate())

  def broken(k):
    if k == 3:
      raise ValueError("batch 3 is broken")
    return k
  with pytest.raises(ValueError, match="batch 3 is broken"):
    list(run_ahead.prefetch(broken, range(10)))


def test_a_token_budget_batch_never_holds_more_positions_than_the_budget():
  """Sec. 5.1's batches of about train.batch_tokens tokens: rows x padded length stays
  within the budget in every bucket (a pair longer than the budget alone excepted)."""
  data = toy_data(3000, max_len=60)
  for budget in (96, 250, 1000):
    cfg = TrainConfig(batching="tokens", batch_tokens=budget, max_length_buckets=8, seed=3)
    shapes = set()
    for k in range(batching.steps_per_epoch(data, cfg)):
      batch = batching.train_batch(data, k, cfg, 64)
      rows, length = batch["targets"].shape
      shapes.add((rows, length))
      assert rows * length <= budget or rows == 1, (budget, rows, length)
    assert len({length for _, length in shapes}) > 2  # Several buckets were seen.


def test_packed_rows_keep_each_sides_segments_and_positions_apart():
  """Sources and targets of different lengths: each side's segment s is the same pair's
  sentence, and its positions restart at that side's own sentence."""
  rng = np.random.default_rng(1)
  sources = [np.append(rng.integers(3, 20, rng.integers(1, 7)), 1) for _ in range(40)]
  targets = [np.append(rng.integers(20, 40, rng.integers(1, 12)), 1) for _ in range(40)]
  data = parallel_data.ParallelData(sources, targets)
  batch = batching.train_batch(data, 0, TrainConfig(batching="packed", batch_size=6), 24)
  pair_of = {tuple(s): i for i, s in enumerate(sources)}
  checked = 0
  for row in range(6):
    for seg in set(batch["inputs_segmentation"][row]) - {0}:
      src_at = batch["inputs_segmentation"][row] == seg
      tgt_at = batch["targets_segmentation"][row] == seg
      i = pair_of[tuple(batch["inputs"][row][src_at])]
      np.testing.assert_array_equal(batch["targets"][row][tgt_at], targets[i])
      np.testing.assert_array_equal(batch["inputs_positions"][row][src_at],
                                    np.arange(len(sources[i])))
      np.testing.assert_array_equal(batch["targets_positions"][row][tgt_at],
                                    np.arange(len(targets[i])))
      checked += len(sources[i]) != len(targets[i])
  assert checked > 5  # Pairs whose two sides differ in length.


def test_the_scores_take_hypotheses_then_references_as_sacrebleu_does():
  """References longer than the hypotheses: BLEU's brevity penalty and chrF's recall
  make every score depend on which side is which."""
  hyps = ["the cat sat on the mat", "a dog runs in the park today", "green trees grow"]
  refs = ["the cat sat on the red mat near the door", "a dog runs in the big park",
          "green trees grow tall in the spring rain"]
  scores, swapped = bleu.score_translations(hyps, refs), bleu.score_translations(refs, hyps)
  assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
  assert scores["bleu_lc"] == pytest.approx(
      sacrebleu.corpus_bleu(hyps, [refs], lowercase=True).score)
  assert scores["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
  plain = sacrebleu.corpus_bleu(hyps, [refs], tokenize="none", smooth_method="none").score
  assert scores["paper_bleu"] == pytest.approx(plain)  # Moses leaves these words as they are.
  assert scores["lowercase_bleu"] == pytest.approx(plain)
  for name in ("bleu", "bleu_lc", "chrf", "paper_bleu", "lowercase_bleu"):
    assert abs(scores[name] - swapped[name]) > 1, name


def test_subword_nmt_merges_and_segments_as_its_command_line(tmp_path):
  """data.tokenizer_type="subword_nmt", as Wu et al. (2021)'s data was made: the merges
  are `cat SOURCES TARGETS | subword-nmt learn-bpe -s N`'s and the segmentation
  `subword-nmt apply-bpe -c CODES`'s."""
  from transformer_jax.data import number_words
  src, tgt = number_words.make_split("train", 300, 10)
  tok = tokenizer.learn_subword_nmt(tmp_path / "tokenizer.model", src, tgt, 80)
  cli = lambda *args, text: subprocess.run(  # The `subword-nmt` command.
      [sys.executable, "-c", "from subword_nmt.subword_nmt import main; main()", *args],
      input=text, capture_output=True, text=True, check=True).stdout
  codes = cli("learn-bpe", "-s", "80", text="".join(s + "\n" for s in src + tgt))
  assert tok.codes == codes
  (tmp_path / "codes").write_text(codes)
  held_out = number_words.make_split("test", 30, 10)[1]
  assert [" ".join(tok.segment(s)) for s in held_out] == cli(
      "apply-bpe", "-c", str(tmp_path / "codes"),
      text="".join(s + "\n" for s in held_out)).splitlines()


def test_subword_nmt_segmentation_ids_and_decoding_are_pinned(tmp_path):
  """Sennrich et al.'s example words, 10 merges: the segmentation, the vocabulary (ids
  0-2 reserved, then the training split's subwords by count), unknown subwords, and
  decoding that joins "@@ " as fairseq's --remove-bpe does."""
  tok = tokenizer.learn_subword_nmt(
      tmp_path / "tokenizer.model", ["low low low low low lower lower",
                                     "newest newest newest newest newest newest"],
      ["widest widest widest"], 10)
  assert [tok.segment(w) for w in ("lowest", "newer", "wider", "slow", "low")] == [
      ["lo@@", "west"], ["ne@@", "w@@", "e@@", "r"], ["wid@@", "e@@", "r"], ["s@@", "low"],
      ["low"]]
  assert tok.pieces() == ["<pad>", "</s>", "<unk>", "newest", "low", "widest", "e@@",
                          "lo@@", "r", "w@@"]
  assert tok.encode(["lower widest", "slow"]) == [[7, 9, 6, 8, 5, 1], [2, 4, 1]]
  assert tok.decode([7, 9, 6, 8, 5, 1, 4]) == "lower widest"
  loaded = tokenizer.load(tmp_path / "tokenizer.model")  # As a run's tokenizer.model.
  assert isinstance(loaded, tokenizer.SubwordNmt) and loaded.pieces() == tok.pieces()
  tokens, lengths = loaded.encode_flat(["lower widest", "slow"])
  assert tokens.tolist() == [7, 9, 6, 8, 5, 1, 2, 4, 1] and lengths.tolist() == [6, 3]
