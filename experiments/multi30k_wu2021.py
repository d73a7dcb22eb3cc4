"""Wu et al. (2021)'s Multi30k recipe (configs/transformer.py:multi30k_wu2021) and one
change at a time from it, compared on val only: their q, k and v initialization against
the full Glorot variance, and the tokens an update (the earlier search's 4,096; 9,600,
about fairseq's real tokens an update once bucket padding is counted).

  python -m launch --experiment=experiments/multi30k_wu2021.py --root=runs \
      --set=data.manual_dir=../shared/data/multi30k
  python -m transformer_jax.evaluate --workdir=runs/multi30k_wu2021/TRIAL --split=eval \
      --average_last=10

Run as a script, it checks the recipe against their own files (github.com/LividWo/
Revisit-MMT, cloned to REPO):

  python experiments/multi30k_wu2021.py --repo=REPO --multi30k=DIR \
      [--hypotheses=WORKDIR/translations/FILE]

1. tokens: data.pretokenize="moses_lowercase" on the plain files in DIR (train and val)
   against their BPE-joined tokens: how many sentences differ.
2. batches: fairseq's batching of their training split (--max-tokens 4096 a GPU, 2 GPUs,
   --required-batch-size-multiple 8, sorted by source then target length): updates an
   epoch, sentences and real target tokens an update.
3. BLEU (with --hypotheses, translations of val): eval/lowercase_bleu against DIR's plain
   references, and sacreBLEU with tokenize="none" on the same hypotheses, prepared the
   same way, against their tokenized references: fairseq's BLEU4 on their text.
Only train and val are read; their test files are not opened.
"""

import argparse
import gzip
import os
import subprocess

import numpy as np
import sacrebleu

from launch import sweep
from transformer_jax.data import pretokenize
from transformer_jax.inference import bleu

CONFIG = "configs/transformer.py:multi30k_wu2021"


def trials():
  return sweep.named(
      wu2021={},
      qkv_init1={"model.qkv_init_scale": 1.0},
      batch4096={"train.batch_tokens": 4096},
      batch9600={"train.batch_tokens": 9600},
  )

THEIRS = {"train": "train", "val": "valid"}  # Our split names -> their file names.


def their_lines(repo: str, split: str, lang: str, join_bpe: bool = True) -> list[str]:
  """Their tokenized sentences, with the BPE joined (what --remove-bpe gives) or not
  (what fairseq trains on)."""
  path = os.path.join(repo, "data", "multi30k-en-de", f"{THEIRS[split]}.{lang}")
  if not os.path.exists(path):  # A bare clone: read the file from git.
    text = subprocess.run(["git", "-C", repo, "show", f"HEAD:{os.path.relpath(path, repo)}"],
                          capture_output=True, text=True, check=True).stdout
  else:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  return (text.replace("@@ ", "") if join_bpe else text).splitlines()


def plain_lines(multi30k: str, split: str, lang: str) -> list[str]:
  with gzip.open(os.path.join(multi30k, f"{split}.{lang}.gz"), "rt", encoding="utf-8") as f:
    return f.read().splitlines()


def tokens(repo: str, multi30k: str) -> None:
  for split in ("train", "val"):
    for lang in ("en", "de"):
      ours = [pretokenize.moses_lowercase(t, lang) for t in plain_lines(multi30k, split, lang)]
      theirs = their_lines(repo, split, lang)
      differ = sum(a != b for a, b in zip(ours, theirs))
      print(f"tokens {split}.{lang}: {differ} of {len(theirs)} sentences differ "
            f"({len(ours)} here)")


def batches(repo: str, max_tokens: int = 4096, gpus: int = 2, multiple: int = 8) -> None:
  lengths = lambda lang: np.array([len(s.split()) + 1  # Subwords and the EOS.
                                   for s in their_lines(repo, "train", lang, join_bpe=False)])
  src, tgt = lengths("en"), lengths("de")
  order = np.random.default_rng(1).permutation(len(src))
  order = order[np.argsort(tgt[order], kind="mergesort")]
  order = order[np.argsort(src[order], kind="mergesort")]
  size, out, batch, longest = np.maximum(src, tgt), [], [], 0
  for i in order:  # fairseq's data_utils.batch_by_size.
    if batch and max(longest, size[i]) * (len(batch) + 1) > max_tokens:
      keep = max(multiple * (len(batch) // multiple), len(batch) % multiple)
      out.append(batch[:keep])
      batch = batch[keep:]
      longest = max((size[j] for j in batch), default=0)
    batch.append(i)
    longest = max(longest, size[i])
  out.append(batch)
  updates = -(-len(out) // gpus)
  print(f"batches: {len(out)} of at most {max_tokens} tokens an epoch, {updates} updates "
        f"on {gpus} GPUs; {len(src) / updates:.0f} sentences and "
        f"{tgt.sum() / updates:.0f} real target tokens an update")


def agreement(repo: str, multi30k: str, hypotheses: str, split: str) -> None:
  with open(hypotheses, encoding="utf-8") as f:
    hyps = f.read().splitlines()
  ours = bleu.lowercase_bleu(hyps, plain_lines(multi30k, split, "de"))
  prepared = [pretokenize.moses_lowercase(h, "de") for h in hyps]
  theirs = sacrebleu.corpus_bleu(prepared, [their_lines(repo, split, "de")],
                                 tokenize="none", force=True)
  print(f"BLEU of {hypotheses}: eval/lowercase_bleu {ours:.2f}; against their tokenized "
        f"references {theirs.score:.2f} ({theirs})")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--repo", required=True, help="a clone of LividWo/Revisit-MMT")
  parser.add_argument("--multi30k", required=True, help="train/val .en.gz/.de.gz")
  parser.add_argument("--hypotheses", help="translations of --split, one a line")
  parser.add_argument("--split", default="val", choices=["val"])
  args = parser.parse_args()
  tokens(args.repo, args.multi30k)
  batches(args.repo)
  if args.hypotheses:
    agreement(args.repo, args.multi30k, args.hypotheses, args.split)


if __name__ == "__main__":
  main()
