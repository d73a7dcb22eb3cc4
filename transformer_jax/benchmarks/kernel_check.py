r"""This project's Pallas kernels on this machine's accelerator, at a real model's sizes:
each one's outputs and gradients against float64 truth (computed on the same device),
beside XLA's path from the same operands (the control), and each one's time against
XLA's, forward and backward. On a GPU the kernels run compiled (Triton); on a CPU, in
Pallas's interpreter (use small sizes there).

  python -m transformer_jax.benchmarks.kernel_check [--tokens=8192] [--d_model=512]
      [--d_ff=2048] [--vocab=37000] [--out=check.json] [--loss_tiles=rows=128,vocab=128 ...]

The loss is also timed as train.loss_kernel="hybrid" computes it (its gradient's two
products by cuBLAS). --loss_tiles times the vocabulary loss in bfloat16 with each
named set of tiles (vocabulary_loss.Tiles fields; the rest its defaults), beside the
default, with its error: a set that does not compile for this GPU is reported, not
fatal.

A kernel is "as exact" when each error is at most conftest's ROUNDING_K (10) times the
control's; the table prints each ratio.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from transformer_jax import cli, files, kernels
from transformer_jax.benchmarks.timing import median_seconds
from transformer_jax.kernels import ffn, residual_norm, vocabulary_loss
from transformer_jax.model import losses

FLAGS = flags.FLAGS
EPS = 0.1  # Label smoothing, Sec. 5.4.
RATE = 0.1  # Residual dropout, Sec. 5.4.
EPSILON = 1e-6
KEY = jnp.array([2024, 11], jnp.uint32)


def relative_difference(a, b) -> float:
  """max |a - b| / max |b|; infinite where a holds a NaN or an infinity."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if not np.all(np.isfinite(a)):
    return float("inf")
  return float(np.abs(a - b).max() / np.abs(b).max())


def _loss_functions(vocab: int):
  def truth(h, w, t):
    logits = h @ w[:vocab].T
    lse = jax.nn.logsumexp(logits, -1)
    target = jnp.take_along_axis(logits, t[:, None], -1)[:, 0]
    weights = (t != 0).astype(logits.dtype)
    nll = lse - target
    loss = (1 - EPS) * nll + EPS * (lse - logits.mean(-1))
    return {"loss": jnp.sum(loss * weights), "nll": jnp.sum(nll * weights)}

  xla = lambda h, w, t: losses.token_metrics(h @ w[:vocab].T, t, EPS)
  fused = lambda tiles, hybrid=False: lambda h, w, t: losses.fused_token_metrics(
      h, w, t, EPS, vocab, tiles=tiles, write_gradient=hybrid)
  return {"truth": truth, "xla": xla, "pallas": fused(None), "hybrid": fused(None, True),
          **{f"pallas {name}": fused(tiles) for name, tiles in _tile_sets().items()}}


def _tile_sets() -> dict[str, vocabulary_loss.Tiles]:
  """--loss_tiles, by their text; each unnamed field as vocabulary_loss.Tiles()."""
  default = vocabulary_loss.Tiles()
  sets = {}
  names = [field.name for field in dataclasses.fields(vocabulary_loss.Tiles)]
  for text in FLAGS.loss_tiles:
    fields = dict(item.partition("=")[::2] for item in text.split(","))
    for name, value in fields.items():
      power = name == "num_stages" or (value.isdigit() and not int(value) & (int(value) - 1))
      if name not in names or not value.isdigit() or int(value) < 1 or not power:
        cli.fail(f"--loss_tiles={text}: {name}={value} is not a Tiles field set to a power "
                 f"of two (num_stages: any count); fields: {', '.join(names)}")
    sets[text] = dataclasses.replace(default, **{k: int(v) for k, v in fields.items()})
  return sets


def _loss_case(dtype: str, key) -> dict:
  tokens, d, vocab = FLAGS.tokens, FLAGS.d_model, FLAGS.vocab
  padded = -(-vocab // 128) * 128
  keys = jax.random.split(key, 3)
  h = jax.random.normal(keys[0], (tokens, d))
  w = 3 * d**-0.5 * jax.random.normal(keys[1], (padded, d))  # Logits of a few units.
  t = jax.random.randint(keys[2], (tokens,), 1, vocab).at[-tokens // 10:].set(0)
  h, w = h.astype(dtype), w.astype(dtype)
  fns = _loss_functions(vocab)

  def values_and_gradients(f, h, w):
    mix = lambda h, w: (lambda m: m["loss"] - 0.7 * m["nll"])(f(h, w, t))
    value, (dh, dw) = jax.value_and_grad(mix, argnums=(0, 1))(h, w)
    return {"mix": value, "d_states": dh, "d_embedding": dw}

  with jax.enable_x64(True):
    got = jax.jit(lambda h, w: values_and_gradients(fns["truth"], h, w))(
        h.astype(jnp.float64), w.astype(jnp.float64))
    truth = jax.tree.map(np.asarray, got)
  row = {}
  for name in fns:
    if name == "truth" or (name.startswith("pallas ") and dtype != "bfloat16"):
      continue
    f = jax.jit(lambda h, w, f=fns[name]: values_and_gradients(f, h, w))
    try:
      got = f(h, w)
    except Exception as e:  # A tile set too large for this GPU's shared memory.
      if name in ("xla", "pallas"):
        raise
      row[name] = {"failed": str(e).strip().splitlines()[0][:300]}
      continue
    row[name] = {k: relative_difference(got[k], truth[k]) for k in truth}
    row[name]["ms"] = 1e3 * median_seconds(f, h, w, repeats=20)
  return row


def _norm_case(dtype: str, key) -> dict:
  tokens, d = FLAGS.tokens, FLAGS.d_model
  keys = jax.random.split(key, 5)
  x = jax.random.normal(keys[0], (tokens, d)).astype(dtype)
  s = (2 * jax.random.normal(keys[1], (tokens, d))).astype(dtype)
  scale = 1 + 0.2 * jax.random.normal(keys[2], (d,))
  bias = 0.2 * jax.random.normal(keys[3], (d,))
  cotangent = jax.random.normal(keys[4], (tokens, d))
  keep = residual_norm.keep_mask((KEY[0], KEY[1]),
                              jnp.arange(x.size, dtype=jnp.uint32).reshape(x.shape), RATE)

  reference = lambda x, s, scale, bias, dtype: residual_norm.reference(
      x, s, scale, bias, keep, rate=RATE, epsilon=EPSILON, dtype=dtype)
  return _vjp_row(
      {"xla": lambda *a: reference(*a, jnp.dtype(dtype)),
       "pallas": lambda *a: residual_norm.residual_norm(*a, KEY, rate=RATE, epsilon=EPSILON)},
      lambda *a: reference(*a, jnp.float64), ("y", "dx", "ds", "dscale", "dbias"),
      (x, s, scale, bias), cotangent)


def _ffn_case(dtype: str, key) -> dict:
  tokens, d, d_ff = FLAGS.tokens, FLAGS.d_model, FLAGS.d_ff
  keys = jax.random.split(key, 4)
  z = jax.random.normal(keys[0], (tokens, d_ff)).astype(dtype)
  bias = 0.1 * jax.random.normal(keys[1], (d_ff,))
  w = d_ff**-0.5 * jax.random.normal(keys[2], (d_ff, d))
  cotangent = jax.random.normal(keys[3], (tokens, d))
  reference = lambda z, bias, w: jax.nn.relu(z + bias.astype(z.dtype)) @ w.astype(z.dtype)
  return _vjp_row({"xla": reference, "pallas": ffn.ffn_relu_product}, reference,
                  ("y", "dz", "dbias", "dw"), (z, bias, w), cotangent)


def _vjp_row(fns: dict, reference, names, operands, cotangent) -> dict:
  """Each of `fns`' output and gradients (`names`) from `operands` against `reference`'s
  in float64, and its time forward and backward."""

  def values_and_gradients(f, *a):
    y, pull = jax.vjp(f, *a[:-1])
    return dict(zip(names, (y, *pull(a[-1].astype(y.dtype)))))

  with jax.enable_x64(True):
    f64 = lambda v: v.astype(jnp.float64)
    truth = jax.jit(lambda *a: values_and_gradients(reference, *a))(
        *map(f64, operands), f64(cotangent))
    truth = jax.tree.map(np.asarray, truth)
  row = {}
  for name, fn in fns.items():
    f = jax.jit(lambda *a, fn=fn: values_and_gradients(fn, *a))
    got = f(*operands, cotangent)
    row[name] = {k: relative_difference(got[k], truth[k]) for k in truth}
    row[name]["ms"] = 1e3 * median_seconds(f, *operands, cotangent, repeats=20)
  return row


# A case for each module of the kernels' table, run as its "pallas" row names it (the
# loss's case also times its "hybrid" row).
CASES = {"vocabulary_loss": _loss_case, "residual_norm": _norm_case, "ffn": _ffn_case}


def main():
  device = jax.devices()[0]
  report = {"device": device.device_kind, "jax": jax.__version__, "tokens": FLAGS.tokens,
            "d_model": FLAGS.d_model, "vocab": FLAGS.vocab, "cases": {}}
  print(f"{device.device_kind}, JAX {jax.__version__}: {FLAGS.tokens} tokens x "
        f"{FLAGS.d_model}, vocabulary {FLAGS.vocab}", flush=True)
  cases = [(k.name, CASES[k.module]) for k in kernels.KERNELS if k.value == "pallas"]
  for seed, (kernel, case) in enumerate(cases):
    for dtype in ("bfloat16", "float32"):
      row = case(dtype, jax.random.key(seed))
      report["cases"][f"{kernel} {dtype}"] = row
      ratios = {k: row["pallas"][k] / max(row["xla"][k], 1e-300) for k in row["xla"]
                if k != "ms"}
      worst = max(ratios, key=ratios.get)
      print(f"{kernel:4} {dtype:8}  XLA {row['xla']['ms']:7.3f} ms, Pallas "
            f"{row['pallas']['ms']:7.3f} ms; error / XLA's: worst {ratios[worst]:.2f} "
            f"({worst}: {row['pallas'][worst]:.2e} vs {row['xla'][worst]:.2e})", flush=True)
      for name, figures in row.items():
        if name.startswith("pallas ") or name == "hybrid":
          print(f"  {'tiles ' + name[7:] if name != 'hybrid' else 'hybrid (cuBLAS products)'}"
                ": " + (f"failed: {figures['failed']}" if "failed" in figures
                else f"{figures['ms']:7.3f} ms, worst error "
                     f"{max(v for k, v in figures.items() if k != 'ms'):.2e}"), flush=True)
      if FLAGS.out:
        files.write_atomic(FLAGS.out, json.dumps(report, indent=1) + "\n")


def define_flags() -> None:
  flags.DEFINE_integer("tokens", 8192, "Rows (decoder positions) of each case.")
  flags.DEFINE_integer("d_model", 512, "Row width.")
  flags.DEFINE_integer("d_ff", 2048, "Inner width of the feed-forward layer.")
  flags.DEFINE_integer("vocab", 37000, "Vocabulary (padded to a multiple of 128).")
  flags.DEFINE_string("out", None, "Write the figures here as JSON.")
  flags.DEFINE_multi_string("loss_tiles", [], "Tiles to time the vocabulary loss with, "
                            "beside the default: vocabulary_loss.Tiles fields, e.g. "
                            "rows=128,vocab=128,num_warps=8 (repeatable).")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
