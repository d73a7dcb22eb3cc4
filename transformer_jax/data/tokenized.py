"""Tokenized training pairs on disk, memory-mapped: built once, read by every start.

A training split is tokenized once per (corpus, tokenizer) into a directory holding,
per side, every sentence's ids back to back (`inputs.tokens.bin`, `targets.tokens.bin`:
uint16 when the vocabulary fits, else int32; each sentence ends in EOS) and the
sentence lengths (`*.lengths.npy`), plus `meta.json` naming what they were made from.
Later starts, every resume after a preemption included, map the token files read-only:
processes on one host share the pages. Each start first checks every file against the
digest meta.json recorded when it was built, and every id against the vocabulary: a
changed, damaged or truncated cache is said in one line naming the file, and rebuilt,
never trained on (docs/results.md: the check's time at WMT's size).

Why flat arrays plus lengths and not array_record: a batch gathers slices of a token
array, not records; numpy maps raw arrays with no extra dependency; and the writer
appends chunk after chunk without knowing the total first (fairseq's "mmap" indexed
dataset is built the same way).

The directory's name is a fingerprint of the corpus identity (corpora.Corpus.identity) and the
tokenizer (its bytes and data.pretokenize): a changed corpus or tokenizer gets a new
directory, never a stale one. Building streams the corpus in chunks and tokenizes on every core; a lock file
lets one process per host build while the others wait and then map the result.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
from typing import Iterable

import numpy as np
from etils import epath

from transformer_jax import files
from transformer_jax.config import NotPrepared
from transformer_jax.data.tokenizer import Subwords

SIDES = ("inputs", "targets")


def fingerprint(corpus_identity: dict, tokenizer: Subwords) -> str:
  digest = hashlib.sha256(json.dumps(corpus_identity, sort_keys=True).encode())
  digest.update(tokenizer.model_file.read_bytes())
  if tokenizer.pretokenizer.name:  # (Raw text adds nothing: earlier caches still match.)
    digest.update(tokenizer.pretokenizer.name.encode())
  return digest.hexdigest()[:16]


def token_dtype(vocab_size: int) -> np.dtype:
  return np.dtype(np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32)


def load_or_build(directory: str, chunks: Iterable[tuple[list[str], list[str]]],
                  tokenizer: Subwords, meta: dict, shared: epath.Path | None = None,
                  publish: bool = False, build: bool = True
                  ) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], bool]:
  """({side: (tokens, lengths)} from `directory`, whether it was built now): built from
  `chunks` first if it does not exist and `build` says so (else NotPrepared). `tokens`
  is a read-only memory map.

  With `shared` (the same cache in a bucket, which cannot be memory-mapped), a missing
  `directory` is first copied from there; with `publish` too, a cache built here is
  copied there, so that the next machine (a recreated TPU VM) copies it instead of
  tokenizing again."""
  os.makedirs(os.path.dirname(directory) or ".", exist_ok=True)
  built = False
  with _lock(directory + ".lock"):
    if shared is not None and not os.path.exists(os.path.join(directory, "meta.json")):
      _fetch(shared, directory)
    if os.path.exists(os.path.join(directory, "meta.json")):
      damage = _damage(directory, tokenizer.vocab_size)
      if damage and not build:
        raise NotPrepared(f"{damage}: the tokenized training split needs preparing again")
      if damage:  # Never trained on: rebuilt from the corpus, as it was made.
        logging.warning("%s: rebuilding the tokenized training split", damage)
        shutil.rmtree(directory)
    if not os.path.exists(os.path.join(directory, "meta.json")):
      if not build:
        raise NotPrepared(f"the tokenized training split is not prepared in "
                          f"{shared if shared is not None else directory}")
      _build(directory, chunks, tokenizer, meta)
      built = True
  if shared is not None and publish and not (shared / "meta.json").exists():
    _copy_cache(epath.Path(directory), shared)
    logging.info("copied the tokenized training split to %s for other machines", shared)
  return _open(directory), built


def _fetch(shared: epath.Path, directory: str) -> None:
  """Copies a finished cache from `shared` to `directory` (whole or absent), if there is
  one; its files are then checked against their digests as any cache is."""
  if not (shared / "meta.json").exists():
    return
  start, partial = time.time(), f"{directory}.partial"
  shutil.rmtree(partial, ignore_errors=True)  # A copy that was killed.
  try:
    _copy_cache(shared, epath.Path(partial))
  except BaseException:
    shutil.rmtree(partial, ignore_errors=True)
    raise
  os.rename(partial, directory)
  logging.info("copied the tokenized training split from %s in %.0f s, into %s", shared,
               time.time() - start, directory)


def _copy_cache(source: epath.Path, target: epath.Path) -> None:
  """Every file that the cache's meta.json names, then meta.json itself (last: it marks
  a whole cache where folders cannot be renamed, as in a bucket); streamed, so that
  local disks and buckets copy alike."""
  names = json.loads((source / "meta.json").read_text())["digests"]
  target.mkdir(parents=True, exist_ok=True)
  for name in [*names, "meta.json"]:
    with (source / name).open("rb") as read, (target / name).open("wb") as write:
      shutil.copyfileobj(read, write, 16 << 20)


def _open(directory: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  with open(os.path.join(directory, "meta.json")) as f:
    dtype = np.dtype(json.load(f)["dtype"])
  out = {}
  for side in SIDES:
    lengths = np.load(os.path.join(directory, f"{side}.lengths.npy"))
    path = os.path.join(directory, f"{side}.tokens.bin")
    tokens = (np.memmap(path, dtype=dtype, mode="r") if os.path.getsize(path)
              else np.zeros(0, dtype))
    out[side] = (tokens, lengths)
  return out


def _digest(path: str) -> str:
  with open(path, "rb") as f:
    return hashlib.file_digest(f, "blake2b").hexdigest()


def _damage(directory: str, vocab_size: int) -> str | None:
  """What is wrong with a finished cache, naming the file, or None: each file's digest
  (written last, in meta.json) checked, the token counts against the lengths, and
  every id within the vocabulary. A cache from before digests counts as unchecked."""
  try:
    with open(os.path.join(directory, "meta.json")) as f:
      saved = json.load(f)
    if "digests" not in saved:
      return f"{directory} has no checksums (made by an earlier version)"
    for name, digest in saved["digests"].items():
      path = os.path.join(directory, name)
      if not os.path.exists(path) or _digest(path) != digest:
        return f"{path} does not match its checksum: it was changed or damaged"
    for side, (tokens, lengths) in _open(directory).items():
      path = os.path.join(directory, f"{side}.tokens.bin")
      if len(tokens) != int(lengths.sum()):
        return f"{path} holds {len(tokens)} tokens, its lengths say {int(lengths.sum())}"
      if len(tokens) and int(tokens.max()) >= vocab_size:
        return f"{path} holds id {int(tokens.max())}, outside the vocabulary of {vocab_size}"
  except (OSError, ValueError, KeyError) as e:
    return f"{directory} cannot be read ({type(e).__name__}: {e})"
  return None


@contextlib.contextmanager
def _lock(path: str):
  with open(path, "w") as f:
    fcntl.flock(f, fcntl.LOCK_EX)  # Released when the file closes, or the process dies.
    yield


def _build(directory: str, chunks, tokenizer: Subwords, meta: dict) -> None:
  start = time.time()
  partial = f"{directory}.partial"
  shutil.rmtree(partial, ignore_errors=True)  # A build that was killed.
  os.makedirs(partial)
  try:
    with files.naming(partial):
      pairs, dtype = _write(partial, chunks, tokenizer, start)
      digests = {name: _digest(os.path.join(partial, name))
                 for name in sorted(os.listdir(partial))}
      with open(os.path.join(partial, "meta.json"), "w") as f:  # Last: a whole build.
        json.dump({**meta, "pairs": pairs, "dtype": dtype.name, "digests": digests}, f,
                  indent=2)
  except BaseException:
    shutil.rmtree(partial, ignore_errors=True)  # A full disk gets its space back.
    raise
  os.rename(partial, directory)  # Whole or absent: meta.json marks a finished build.
  logging.info("tokenized the training split once: %d pairs in %.0f s, kept in %s", pairs,
               time.time() - start, directory)


def _write(partial: str, chunks, tokenizer: Subwords, start: float) -> tuple[int, np.dtype]:
  """Each side's tokens (one flat file) and lengths; the number of pairs and the dtype."""
  dtype = token_dtype(tokenizer.vocab_size)
  lengths = {side: [] for side in SIDES}
  pairs = 0
  with contextlib.ExitStack() as stack:
    out = {side: stack.enter_context(open(os.path.join(partial, f"{side}.tokens.bin"), "wb"))
           for side in SIDES}
    for chunk in chunks:
      for side, texts in zip(SIDES, chunk):
        tokens, chunk_lengths = tokenizer.encode_flat(texts, target=side == "targets")
        out[side].write(tokens.astype(dtype).tobytes())  # (tofile's full disk: no errno.)
        lengths[side].append(chunk_lengths)
      pairs += len(chunk[0])
      logging.info("tokenized %d pairs (%.0f s)", pairs, time.time() - start)
  for side in SIDES:
    np.save(os.path.join(partial, f"{side}.lengths.npy"),
            np.concatenate(lengths[side]) if lengths[side] else np.zeros(0, np.int32))
  return pairs, dtype
