"""Wu et al. (2021)'s Multi30k recipe (configs/transformer.py:multi30k_wu2021) and one
change at a time from it, compared on val only: three seeds of the recipe (its spread:
mean and standard deviation), the same three with SentencePiece BPE in place of their
subword-nmt BPE (sentencepiece*), their q, k and v initialization against the full
Glorot variance, and the tokens an update (the earlier search's 4,096; 9,600, about
fairseq's real tokens an update once bucket padding is counted). Runs ensemble:
`evaluate --workdir=runs/multi30k_wu2021/wu2021,runs/multi30k_wu2021/seed1`.

  python -m launch --experiment=experiments/multi30k_wu2021.py --root=runs \
      --set=data.manual_dir=../shared/data/multi30k
  python -m transformer_jax.evaluate --workdir=runs/multi30k_wu2021/TRIAL --split=eval \
      --average_last=10

On a 2-core CPU a trial takes 4-9 hours; on a lent GPU the trials run side by side in
minutes, from an offline bundle (docs/scaling.md, "Training on the GPU").

Run as a script, it checks the recipe against their own files (github.com/LividWo/
Revisit-MMT, cloned to REPO):

  python experiments/multi30k_wu2021.py --repo=REPO --multi30k=DIR \
      [--hypotheses=WORKDIR/translations/FILE]

1. tokens: data.pretokenize="moses_lowercase" on the plain files in DIR (train and val)
   against their BPE-joined tokens: how many sentences differ. subwords: the merges
   data.tokenizer_type="subword_nmt" learns (10,000) against their `code` file, and
   train and val so segmented against their files.
2. batches: fairseq's batching of their training split (--max-tokens 4096 a GPU, 2 GPUs,
   --required-batch-size-multiple 8, sorted by source then target length): updates an
   epoch, sentences and real target tokens an update.
3. BLEU (with --hypotheses, translations of val): eval/lowercase_bleu against DIR's plain
   references, and sacreBLEU with tokenize="none" on the same hypotheses, prepared the
   same way, against their tokenized references: fairseq's BLEU4 on their text.
Only train and val are read; their test files are not opened.

  python experiments/multi30k_wu2021.py --attention=WORKDIR:STEP [--attention=...]

4. attention: the mean entropy of each attention layer of a checkpoint on val, beside
   that of attending to every key alike (docs/results.md: why dropout 0.3 stalled).
"""

import argparse
import gzip
import os
import subprocess

import numpy as np
import sacrebleu

from transformer_jax.data import pretokenize
from transformer_jax.inference import bleu

CONFIG = "configs/transformer.py:multi30k_wu2021"


def trials():
  from launch import sweep  # Imported here: run as a script, the file needs no `launch`.
  sentencepiece = {"data.tokenizer_type": "bpe", "data.vocab_size": 9712}
  return sweep.named(
      wu2021={},
      seed1={"train.seed": 1},
      seed2={"train.seed": 2},
      sentencepiece=sentencepiece,
      sentencepiece_seed1={**sentencepiece, "train.seed": 1},
      sentencepiece_seed2={**sentencepiece, "train.seed": 2},
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


def subwords(repo: str, multi30k: str, merges: int = 10_000) -> None:
  import tempfile
  from transformer_jax import config as config_lib
  from transformer_jax.data import corpora, tasks, tokenizer
  cfg = config_lib.DataConfig(task="multi30k", manual_dir=multi30k, vocab_size=merges,
                              pretokenize="moses_lowercase", tokenizer_type="subword_nmt")
  with tempfile.TemporaryDirectory() as tmp:
    tok = tokenizer.learn_subword_nmt(os.path.join(tmp, "tokenizer.model"),
                                      *tasks.train_sentences(corpora.corpus(cfg)), merges)
  path = os.path.join(repo, "data", "multi30k-en-de", "code")
  theirs = subprocess.run(["git", "-C", repo, "show", "HEAD:data/multi30k-en-de/code"],
                          capture_output=True, text=True, check=True).stdout \
      if not os.path.exists(path) else open(path, encoding="utf-8").read()
  ours, theirs = tok.codes.splitlines()[1:], theirs.splitlines()[1:]
  first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
  print(f"subwords: {sum(a == b for a, b in zip(ours, theirs))} of {len(theirs)} merges "
        f"identical{'' if first is None else f' (the first difference: merge {first + 1})'}; "
        f"{len(set(ours) & set(theirs))} in common; vocabulary {tok.vocab_size - 3} subwords")
  for split in ("train", "val"):
    for lang in ("en", "de"):
      mine = [" ".join(tok.segment(pretokenize.moses_lowercase(t, lang)))
              for t in plain_lines(multi30k, split, lang)]
      their = their_lines(repo, split, lang, join_bpe=False)
      differ = sum(a != b for a, b in zip(mine, their))
      print(f"subwords {split}.{lang}: {differ} of {len(their)} sentences segmented "
            f"differently; {np.mean([len(t.split()) + 1 for t in mine]):.2f} subwords a "
            f"sentence with EOS ({np.mean([len(t.split()) + 1 for t in their]):.2f} theirs)")


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


def attention(workdir_step: str, pairs: int = 256) -> None:
  """Mean entropy (nats) of every attention layer's heads on the first `pairs` val
  pairs, teacher-forced without dropout, beside that of uniform attention: a
  cross-attention at the uniform entropy reads only the average of the source."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  from transformer_jax.data import buckets, tasks
  from transformer_jax.inference import restore
  from transformer_jax.model import attention as attention_lib

  workdir, step = workdir_step.rsplit(":", 1)
  trained = restore.load_workdir(workdir)
  params, step = restore.restore_params(trained, int(step))
  data = tasks.load_task(trained.cfg.data, workdir).eval
  rows = range(min(pairs, len(data)))
  width = lambda seqs: max(len(seqs[i]) for i in rows)
  src = buckets.padded_rows(data.inputs, rows, width(data.inputs), len(rows))
  tgt = buckets.padded_rows(data.targets, rows, width(data.targets), len(rows))
  entropies = []

  def record(next_fun, args, kwargs, context):
    if isinstance(context.module, attention_lib.MultiHeadAttention) and (
        context.method_name == "__call__"):
      x_q, x_kv, mask = args
      q = jnp.einsum("bld,dhk->bhlk", x_q, context.module.get_variable("params", "query"))
      k = jnp.einsum("bld,dhk->bhlk", x_kv, context.module.get_variable("params", "key"))
      logits = jnp.where(mask.dense(), q @ k.swapaxes(-1, -2) / jnp.sqrt(q.shape[-1]),
                         -jnp.inf)
      p = jax.nn.softmax(logits)
      h = -jnp.sum(jnp.where(p > 0, p * jnp.log(p), 0.0), -1)  # [batch, heads, queries]
      uniform = jnp.log(jnp.maximum(mask.dense().sum(-1), 1))  # [batch, 1, queries]
      valid = mask.query_valid[:, None, :]
      mean = lambda x: float((x * valid).sum() / valid.sum() / x.shape[1])
      entropies.append(("/".join(context.module.path), mean(h), mean(uniform)))
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(record):
    trained.model.apply({"params": params}, jnp.asarray(src), jnp.asarray(tgt))
  print(f"attention entropy of {workdir} at step {step} ({len(rows)} val pairs), nats, "
        "and that of attending to every key alike:")
  for path, h, uniform in entropies:
    print(f"  {path}: {h:.3f} (uniform {uniform:.3f})")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--repo", help="a clone of LividWo/Revisit-MMT")
  parser.add_argument("--multi30k", help="train/val .en.gz/.de.gz")
  parser.add_argument("--hypotheses", help="translations of --split, one a line")
  parser.add_argument("--split", default="val", choices=["val"])
  parser.add_argument("--attention", action="append", default=[], metavar="WORKDIR:STEP",
                      help="the attention entropy of a run's checkpoint (repeatable)")
  args = parser.parse_args()
  if bool(args.repo) != bool(args.multi30k) or not (args.repo or args.attention):
    parser.error("give --repo and --multi30k (the checks), --attention, or both")
  if args.repo:
    tokens(args.repo, args.multi30k)
    subwords(args.repo, args.multi30k)
    batches(args.repo)
    if args.hypotheses:
      agreement(args.repo, args.multi30k, args.hypotheses, args.split)
  for workdir_step in args.attention:
    attention(workdir_step)


if __name__ == "__main__":
  main()
