"""The tokenizers (transformer_jax/data/tokenizer.py): SentencePiece and subword-nmt."""

import subprocess
import sys

import pytest

from conftest import numbers_data, ROOT
from transformer_jax.data import corpora, parallel_data, tasks, tokenizer


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


def test_tokenizer_training_is_deterministic_across_processes(tmp_path):
  """The same corpus gives the same tokenizer in any process; here
  with sampling on (2,000 of 6,000 sentences), in two separate processes."""
  import subprocess, sys  # noqa: E401
  code = ("import sys; from transformer_jax.data import corpora, tasks; "
          "from transformer_jax.config import DataConfig; "
          "cfg = DataConfig(task='numbers', vocab_size=100, num_train_examples=3000, "
          "num_eval_examples=32, tokenizer_sentences=2000); "
          "tasks.run_tokenizer(corpora.corpus(cfg), sys.argv[1])")
  models = []
  for name in ("a", "b"):
    subprocess.run([sys.executable, "-c", code, str(tmp_path / name)], check=True,
                   cwd=ROOT, capture_output=True, timeout=300)
    models.append((tmp_path / name / "tokenizer.model").read_bytes())
  assert models[0] == models[1]
  sample = tasks.sample_sentences(corpora.corpus(numbers_data(tokenizer_sentences=2000)))
  assert len(sample) == 2000 and len(set(sample)) > 1500


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


def test_a_marian_tokenizer_reorders_ids_and_segments_each_side_with_its_model(tmp_path):
  """An imported Marian tokenizer (tokenizer.Marian): padding, EOS and unknown take ids
  0, 1, 2 whatever Marian numbers them (here EOS 0, unknown 1, padding last, as
  OPUS-MT), the others keep Marian's order; sources are segmented by the source model,
  targets by the target model; a piece outside the vocabulary is unknown; decoding
  stops at EOS and drops padding and unknown (MarianTokenizer's skip_special_tokens)."""
  import sentencepiece as spm
  models = {}
  for side, text in (("source", "a cat sat on the mat"), ("target", "EINE KATZE SASS")):
    path = tmp_path / f"{side}.model"
    spm.SentencePieceTrainer.train(sentence_iterator=iter([text] * 20), model_prefix=str(
        path.with_suffix("")), vocab_size=20, hard_vocab_limit=False, minloglevel=2)
    models[side] = spm.SentencePieceProcessor(model_file=str(path))
  source_pieces = models["source"].encode("a cat sat", out_type=str)
  target_pieces = models["target"].encode("EINE KATZE", out_type=str)
  left_out = target_pieces[-1]  # Not in the vocabulary: unknown.
  kept = list(dict.fromkeys(p for p in source_pieces + target_pieces if p != left_out))
  vocabulary = ["</s>", "<unk>", *kept, "<pad>"]
  tok = tokenizer.write_marian(tmp_path / "tokenizer.model",
                               (tmp_path / "source.model").read_bytes(),
                               (tmp_path / "target.model").read_bytes(), vocabulary,
                               ["<pad>", "</s>", "<unk>"])
  assert tok.pieces()[:3] == ["<pad>", "</s>", "<unk>"]
  assert tok.marian_ids[:3] == [len(vocabulary) - 1, 0, 1]
  assert [vocabulary[m] for m in tok.marian_ids] == tok.pieces()
  assert tok.marian_ids[3:] == list(range(2, len(vocabulary) - 1))  # Marian's order.
  ids = {piece: i for i, piece in enumerate(tok.pieces())}
  assert tok.encode(["a cat sat"]) == [[ids[p] for p in source_pieces] + [tokenizer.EOS_ID]]
  encoded = tok.encode(["EINE KATZE"], target=True)[0]
  assert encoded == [ids.get(p, tokenizer.UNK_ID) for p in target_pieces] + [tokenizer.EOS_ID]
  assert tokenizer.UNK_ID in encoded
  shown = models["target"].decode_pieces([p for p in target_pieces if p != left_out])
  assert tok.decode(encoded + [5, 6]) == shown.strip()
  assert isinstance(tokenizer.load(tmp_path / "tokenizer.model"), tokenizer.Marian)
  (tmp_path / "tokenizer.model").write_text('{"format": "marian", "source_spm": "AA"}')
  with pytest.raises(ValueError, match="tokenizer.model is not a readable Marian model.*"
                                       "Import the model again"):
    tokenizer.load(tmp_path / "tokenizer.model")
