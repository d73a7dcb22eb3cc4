"""Decoding speed: beam search over sentences given as token ids, with random weights or
a trained run's checkpoint, optionally beside CTranslate2 or an earlier revision of this
code. `python -m transformer_jax.benchmark` is the command line (see there)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Callable, Sequence

import flax.linen as nn
import flax.serialization
import jax
import numpy as np

from transformer_jax import cli
from transformer_jax.benchmarks import peers
from transformer_jax.data import corpora
from transformer_jax.inference import bleu, restore, translation


def benchmark_trained_decoding(workdir: str, split: str, repeats: int,
                                compare_rev: str | None = None,
                                ctranslate2: bool = False) -> dict:
  """Decoding of a trained run's latest checkpoint on a real split, with its scores;
  with `ctranslate2`, also CTranslate2's beam search on the exported weights. Returns
  the figures (for --json)."""
  try:
    trained = restore.load_workdir(workdir)
    params, step = restore.restore_params(trained)
    sources, references = corpora.corpus(trained.cfg.data).split(split)
  except (FileNotFoundError, RuntimeError, ValueError) as e:
    cli.fail(str(e))
  print(f"devices: {jax.device_count()} x {jax.devices()[0].device_kind}; "
        f"{workdir} step {step}")
  tok, lang = trained.tokenizer, trained.cfg.data.target_lang
  score = lambda outputs: bleu.score_translations(
      [tok.decode(ids) for ids in outputs], references, lang)["bleu"]
  encoded = tok.encode(sources)
  outputs, best = benchmark_decoding(
      params, trained.model, encoded, trained.cfg.decode,
      f"{len(sources)} {trained.cfg.data.task} {split} sentences", repeats, compare_rev,
      score)
  if ctranslate2:
    ct2_outputs, ct2_first, ct2_best = decode_with_ctranslate2(
        params, trained, encoded, repeats)
    _report("CTranslate2", encoded, ct2_outputs, ct2_first, ct2_best, None, score)
    same = sum(a == b for a, b in zip(outputs, ct2_outputs))
    print(f"  this code runs at {ct2_best / best:.2f}x CTranslate2's speed; {same} of "
          f"{len(sources)} outputs identical (its length penalty is length^alpha)")
  return {"device_kind": jax.devices()[0].device_kind, "jax_version": jax.__version__,
          "workdir": workdir, "step": step, "decode_sentences": len(sources),
          "decode_s": best, "decode_beam_size": trained.cfg.decode.beam_size,
          "bleu": score(outputs)}


def decode_with_ctranslate2(params, trained, encoded, repeats: int):
  """(outputs, first pass, best pass) of CTranslate2's beam search on the exported
  weights, on every core of this machine, with the run's decode settings."""
  from transformer_jax.inference import ctranslate2
  pieces = trained.tokenizer.pieces()
  with tempfile.TemporaryDirectory() as tmp:
    ctranslate2.save_ctranslate2(params, trained.cfg.model, pieces, tmp)
    translator = ctranslate2.ctranslate2_translator(tmp)
    return time_decoding(lambda: ctranslate2.ctranslate2_translate_ids(
        translator, pieces, encoded, trained.cfg.decode), repeats)


def benchmark_decoding(params, model, sources: Sequence[Sequence[int]], decode_cfg,
                       what: str, repeats: int, compare_rev: str | None = None,
                       score: Callable | None = None, flax_wmt_dir: str | None = None):
  """Prints beam-search speed on `sources` (token ids): the first pass and the best of
  `repeats` more; with `compare_rev`, that of the revision's code on the same sentences
  and weights; with `flax_wmt_dir`, the Flax WMT example's at the same dimensions.
  `score(outputs)` -> BLEU. Returns (outputs, best seconds)."""
  outputs, first, best = time_decoding(
      lambda: translation.translate_ids(params, model, sources, decode_cfg), repeats)
  shapes = len(translation.decode_input_shapes(sources, model.config.max_len, decode_cfg,
                                               translation.params_mesh(params)))
  print(f"decode: {what}, beam {decode_cfg.beam_size}")
  _report("this code", sources, outputs, first, best, shapes, score)
  if compare_rev:
    old_outputs, old_first, old_best = decode_at_revision(
        compare_rev, params, model.config, decode_cfg, sources, repeats)
    _report(f"revision {compare_rev}", sources, old_outputs, old_first, old_best,
            None, score)
    same = sum(a == b for a, b in zip(outputs, old_outputs))
    print(f"  speed-up {old_best / best:.2f}x over revision {compare_rev}; "
          f"{same} of {len(sources)} outputs identical")
  if flax_wmt_dir:
    flax_outputs, flax_first, flax_best = time_decoding(peers.flax_wmt_translate(
        flax_wmt_dir, model.config, decode_cfg, sources), repeats)
    _report("Flax WMT example", sources, flax_outputs, flax_first, flax_best, None, None)
    print(f"  this code runs at {flax_best / best:.2f}x the Flax WMT example's speed "
          "(same dimensions and batches; its own random weights)")
  return outputs, best


def _report(name, sources, outputs, first, best, shapes, score) -> None:
  tokens = sum(len(ids) + 1 for ids in outputs)  # + EOS
  compiled = f", compiling {shapes} programs" if shapes else ""
  bleu_text = f"; sacreBLEU {score(outputs):.2f}" if score else ""
  print(f"  {name}: first pass {first:.1f} s{compiled}; then {best:.2f} s: "
        f"{len(sources) / best:.1f} sentences/s, {tokens / best:,.0f} target tokens/s"
        f"{bleu_text}")


def time_decoding(translate, repeats: int):
  """(outputs, seconds of the first pass, best seconds of `repeats` more)."""
  start = time.perf_counter()
  outputs = translate()
  first = time.perf_counter() - start
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    translate()
    best = min(best, time.perf_counter() - start)
  return outputs, first, best


# Runs in an extracted older revision (its transformer_jax is the one imported), so it
# uses only what every revision has: ModelConfig, DecodeConfig, Transformer and
# translate_ids(params, model, sources, decode_cfg), before and after the package's
# folders; and this module's time_decoding, whose source goes before it.
_REVISION_WORKER = """
import dataclasses, json, sys, time
import flax.serialization
from transformer_jax import config as config_lib
try:
  from transformer_jax.inference.translation import translate_ids
  from transformer_jax.model.transformer import Transformer
except ImportError:  # A revision with a flat package: inference.py and model.py.
  from transformer_jax.inference import translate_ids
  from transformer_jax.model import Transformer

job = json.load(open(sys.argv[1]))
known = lambda cls, d: cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)
                              if f.name in d})
model = Transformer(known(config_lib.ModelConfig, job["model"]))
decode_cfg = known(config_lib.DecodeConfig, job["decode"])
params = flax.serialization.msgpack_restore(open(sys.argv[2], "rb").read())
outputs, first, best = time_decoding(  # Defined above this script: this module's.
    lambda: translate_ids(params, model, job["sources"], decode_cfg), job["repeats"])
json.dump({"outputs": [list(map(int, o)) for o in outputs], "first": first, "best": best},
          open(sys.argv[3], "w"))
"""


def decode_at_revision(rev: str, params, model_cfg, decode_cfg, sources, repeats: int):
  """(outputs, first pass, best pass) of decoding `sources` with the code of git
  revision `rev` and the same weights, in a subprocess."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  with tempfile.TemporaryDirectory() as tmp:
    try:
      archive = subprocess.run(["git", "-C", root, "archive", rev], check=True,
                               capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
      cli.fail(f"--compare_rev={rev}: cannot extract it from the git repository at "
               f"{root}: {getattr(e, 'stderr', b'').decode().strip() or e}")
    subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
    job, weights, result = (os.path.join(tmp, n) for n in ("job.json", "params", "out.json"))
    pathlib.Path(job).write_text(json.dumps({
        "model": dataclasses.asdict(model_cfg), "decode": dataclasses.asdict(decode_cfg),
        "sources": [list(map(int, s)) for s in sources], "repeats": repeats}))
    pathlib.Path(weights).write_bytes(flax.serialization.msgpack_serialize(
        jax.tree.map(np.asarray, nn.meta.unbox(params))))
    env = {**os.environ, "PYTHONPATH": tmp}
    script = inspect.getsource(time_decoding) + _REVISION_WORKER
    subprocess.run([sys.executable, "-c", script, job, weights, result], cwd=tmp, env=env,
                   check=True)
    out = json.loads(pathlib.Path(result).read_text())
  return out["outputs"], out["first"], out["best"]
