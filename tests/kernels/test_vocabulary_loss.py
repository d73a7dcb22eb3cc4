"""The fused vocabulary loss (transformer_jax/kernels/vocabulary_loss.py, interpreted on
the CPU) against the textbook loss in float64; its error, and its gradients', bounded
by ROUNDING_K times the control's: XLA's path (the logits written in the same dtype,
then model/losses.py's loss), measured from the same truth (conftest)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_within_rounding, relative_difference, strict_interpreter
from transformer_jax.kernels import vocabulary_loss, vocabulary_loss_tpu
from transformer_jax.model import losses

VOCAB, PADDED_VOCAB, D = 131, 150, 24  # Neither a multiple of a tile; d padded to 32.
# Several tiles of each kind, for each backend's kernels (TPU tiles in multiples of
# its 8 x 128 registers; the vocabulary's second tile is mostly padding).
SMALL = {"gpu": vocabulary_loss.Tiles(rows=16, vocab=32, grad_w_vocab=16, grad_w_rows=16,
                                      grad_h_rows=16, depth=16),
         "tpu": vocabulary_loss_tpu.Tiles(rows=16, vocab=128)}
BACKENDS = list(SMALL)
# The kernels' backward passes: each backend's fused one, and the GPU's that writes the
# logits' gradient for XLA's products (train.loss_kernel="hybrid").
BACKWARDS = {"gpu": ("gpu", False), "tpu": ("tpu", False), "gpu hybrid": ("gpu", True)}
EPS = 0.1  # Sec. 5.4.


def _textbook(states, embedding, targets):
  """Two log-softmaxes over the real vocabulary (optax), any dtype."""
  import optax
  logits = states @ embedding[:VOCAB].T
  weights = (targets != 0).astype(logits.dtype)
  smoothed = optax.smooth_labels(jax.nn.one_hot(targets, VOCAB, dtype=logits.dtype), EPS)
  return {"loss": jnp.sum(optax.softmax_cross_entropy(logits, smoothed) * weights),
          "nll": jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, targets)
                         * weights),
          "correct": jnp.sum((jnp.argmax(logits, -1) == targets) * weights),
          "tokens": jnp.sum(weights)}


def _xla(states, embedding, targets):
  """What train.loss_kernel="xla" computes: the logits in the compute dtype, then the
  one-pass loss."""
  return losses.token_metrics(states @ embedding[:VOCAB].T, targets, EPS)


def _fused(states, embedding, targets, backward):
  backend, write_gradient = BACKWARDS[backward]
  return losses.fused_token_metrics(states, embedding, targets, EPS, VOCAB,
                                    interpret=strict_interpreter(), tiles=SMALL[backend],
                                    backend=backend, write_gradient=write_gradient)


def _values_and_gradients(f, states, embedding, targets):
  """f's sums, and the gradients of loss - 0.7 nll (any mix of the two: the kernels'
  two cotangents, the log-sum-exp's and the target logit's, enter apart)."""
  mix = lambda s, w: (lambda m: m["loss"] - 0.7 * m["nll"])(f(s, w, targets))
  d_states, d_embedding = jax.grad(mix, argnums=(0, 1))(states, embedding)
  return {**f(states, embedding, targets), "d_states": d_states, "d_embedding": d_embedding}


def _case(name):
  """(states [rows, length, D], embedding [PADDED_VOCAB, D], targets): logits of a few
  units, the padded vocabulary rows as large as the real ones (a padded column let in
  would change the loss), some padding at each row's end."""
  rows, length = {"odd sizes": (3, 13), "one token": (1, 1),
                  "a row of padding": (4, 5)}[name]
  keys = jax.random.split(jax.random.key(0), 3)
  states = jax.random.normal(keys[0], (rows, length, D))
  embedding = 0.5 * jax.random.normal(keys[1], (PADDED_VOCAB, D))
  targets = jax.random.randint(keys[2], (rows, length), 1, VOCAB)
  if length > 2:
    targets = targets.at[:, -2:].set(0)
  if name == "a row of padding":
    targets = targets.at[2].set(0)
  return states, embedding, targets


@pytest.mark.parametrize("backward", BACKWARDS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", ["odd sizes", "one token", "a row of padding"])
def test_the_fused_loss_and_its_gradients_are_as_accurate_as_xla_s(dtype, case, backward):
  """Sec. 5.4's smoothed loss, the nll, the accuracy and both gradients, from states and
  the embedding in the compute dtype: as accurate as XLA's logits-then-loss path,
  over a vocabulary, rows and d that fill no tile; padding rows and the padded
  vocabulary rows get no gradient, and the gradients keep their operands' dtypes."""
  states, embedding, targets = _case(case)
  states, embedding = states.astype(dtype), embedding.astype(dtype)
  with jax.enable_x64(True):  # The truth of these (rounded) operands.
    f64 = lambda x: x.astype(jnp.float64)
    truth = _values_and_gradients(_textbook, f64(states), f64(embedding), targets)
  control = _values_and_gradients(_xla, states, embedding, targets)
  got = _values_and_gradients(functools.partial(_fused, backward=backward), states,
                              embedding, targets)
  assert got["d_states"].dtype == got["d_embedding"].dtype == jnp.dtype(dtype)
  assert float(got["tokens"]) == float(truth["tokens"])
  assert_within_rounding({k: relative_difference(got[k], truth[k]) for k in got},
                         {k: relative_difference(control[k], truth[k]) for k in got})
  assert not np.any(np.asarray(got["d_states"])[targets == 0])
  assert not np.any(np.asarray(got["d_embedding"])[VOCAB:])


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_statistic_and_tile_size_agree_with_the_plain_computation(backend):
  """The kernels' own outputs (largest logit, log-sum-exp, target logit) with the
  default tiles and with small ones equal jnp's, float32 throughout: the tiles change
  the order of the sums and nothing else."""
  states, embedding, targets = _case("odd sizes")
  h, t = states.reshape(-1, D), targets.reshape(-1)
  logits = jnp.dot(h, embedding[:VOCAB].T, precision=jax.lax.Precision.HIGHEST)
  want = (logits.max(-1), jax.nn.logsumexp(logits, -1),
          jnp.take_along_axis(logits, t[:, None], -1)[:, 0])
  for tiles in (None, type(SMALL[backend])(), SMALL[backend]):
    got = vocabulary_loss.statistics(h, embedding, t, VOCAB, interpret=strict_interpreter(),
                                     tiles=tiles, backend=backend)
    for name, a, b in zip(("top", "lse", "target"), got, want):
      assert relative_difference(a, b) < 1e-5, (tiles, name, relative_difference(a, b))
