r"""The embedding lookup's gradient, timed alone: this model's `Embed` (rows gathered from
the float32 table, then cast) against Flax's `nn.Embed` (the table cast to bfloat16 first),
a one-hot matrix product and `jax.ops.segment_sum`, at base's batch and vocabulary.

  python -m transformer_jax.benchmarks.lookup_gradient [--rows=97 --length=256
      --vocab=37120 --d_model=512 --repeats=20]

Tokens come two ways: uniform at random, and as a batch holds them (Zipf-distributed
word ids, 16% padding, an EOS a row), where many updates go to the same rows. Prints the
median of --repeats timed calls of each, after one to compile (docs/results.md, "Base
and big on one GPU").
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from transformer_jax import cli
from transformer_jax.benchmarks import timing
from transformer_jax.config import EOS_ID, PAD_ID
from transformer_jax.model.transformer import Embed

FLAGS = flags.FLAGS


def token_batches(rows: int, length: int, vocab: int) -> dict[str, jax.Array]:
  """Uniform tokens, and tokens shaped like a batch: Zipf ids, 16% padding, EOS."""
  rng = np.random.default_rng(0)
  batch = np.minimum(rng.zipf(1.2, (rows, length)) + 3, vocab - 1)
  real = int(length * 0.84)
  batch[:, real:] = PAD_ID
  batch[:, real - 1] = EOS_ID
  return {"random": jnp.asarray(rng.integers(0, vocab, (rows, length)), jnp.int32),
          "as in a batch": jnp.asarray(batch, jnp.int32)}


def table_gradients(vocab: int, d_model: int) -> dict:
  """name -> (table [vocab, d_model] float32, tokens, cotangent of the rows in bfloat16)
  -> the table's gradient: three lookups' transposes, and segment_sum written out."""
  module = lambda cls: lambda table, tokens: cls(vocab, d_model, dtype=jnp.bfloat16).apply(
      {"params": {"embedding": table}}, tokens)
  one_hot = lambda table, tokens: jax.nn.one_hot(tokens, vocab, dtype=jnp.bfloat16) @ \
      table.astype(jnp.bfloat16)
  transpose = lambda lookup: lambda table, tokens, cotangent: jax.vjp(
      lambda w: lookup(w, tokens), table)[1](cotangent)[0]
  segment_sum = lambda table, tokens, cotangent: jax.ops.segment_sum(
      cotangent.reshape(-1, d_model).astype(jnp.float32), tokens.reshape(-1), vocab)
  return {"this model's Embed": transpose(module(Embed)),
          "flax nn.Embed": transpose(module(nn.Embed)),
          "one-hot matrix product": transpose(one_hot),
          "segment_sum, float32": segment_sum}


def main():
  rows, length, vocab, d = FLAGS.rows, FLAGS.length, FLAGS.vocab, FLAGS.d_model
  rng = np.random.default_rng(1)
  table = jnp.asarray(rng.normal(size=(vocab, d)) * d**-0.5, jnp.float32)
  cotangent = jnp.asarray(rng.normal(size=(rows, length, d)), jnp.bfloat16)
  print(f"{jax.devices()[0].device_kind}, JAX {jax.__version__}: the gradient of a lookup "
        f"of {rows} x {length} tokens in a {vocab} x {d} table, median of {FLAGS.repeats}")
  for kind, tokens in token_batches(rows, length, vocab).items():
    print(f"tokens {kind}:")
    for name, gradient in table_gradients(vocab, d).items():
      ms = 1e3 * timing.median_seconds(gradient, table, tokens, cotangent,
                                       repeats=FLAGS.repeats)
      print(f"  {name:30s} {ms:9.3f} ms")


def define_flags() -> None:
  flags.DEFINE_integer("rows", 97, "Rows of the batch (base: 97 of 256 positions).")
  flags.DEFINE_integer("length", 256, "Positions a row.")
  flags.DEFINE_integer("vocab", 37120, "Rows of the table (base's, padded to 128).")
  flags.DEFINE_integer("d_model", 512, "Columns of the table.")
  flags.DEFINE_integer("repeats", 20, "Timed calls of each.")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
