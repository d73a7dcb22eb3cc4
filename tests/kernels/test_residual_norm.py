"""The fused residual connection, LayerNorm(x + Dropout(s)) (Sec. 3.1, 5.4;
transformer_jax/kernels/residual_norm.py, interpreted on the CPU): its dropout bits are
Threefry's, its masks keep 1 - rate of the elements independently, and its output and
gradients are as accurate as XLA's path with the same mask (errors from float64 truth,
bounded by the control's: conftest)."""

import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_within_rounding, relative_difference, strict_interpreter
from transformer_jax.kernels import residual_norm

KEY = jnp.array([2024, 11], jnp.uint32)
EPSILON = 1e-6


def test_the_dropout_bits_are_jax_s_threefry():
  """Threefry-2x32 as the kernels compute it, word for word JAX's primitive."""
  keys = jax.random.bits(jax.random.key(0), (2, 1000), jnp.uint32)
  counts = jax.random.bits(jax.random.key(1), (2, 1000), jnp.uint32)
  ours = residual_norm.threefry2x32(keys[0], keys[1], counts[0], counts[1])
  theirs = jex.random.threefry2x32_p.bind(keys[0], keys[1], counts[0], counts[1])
  np.testing.assert_array_equal(np.stack(ours), np.stack(theirs))


@pytest.mark.parametrize("rate", [0.1, 0.3])
def test_masks_keep_one_minus_the_rate_independently(rate):
  """Over 2^20 elements: the kept fraction within 5 standard errors of 1 - rate;
  neighbours, and two keys' masks, agree as independent draws do."""
  n, keep = 2**20, 1.0 - rate
  index = jnp.arange(n, dtype=jnp.uint32)
  a = np.asarray(residual_norm.keep_mask((KEY[0], KEY[1]), index, rate))
  b = np.asarray(residual_norm.keep_mask((KEY[0], KEY[1] + 1), index, rate))
  within = lambda fraction, p: abs(fraction - p) < 5 * np.sqrt(p * (1 - p) / n)
  assert within(a.mean(), keep)
  both = keep * keep + rate * rate  # Two independent draws agree this often.
  assert within((a == b).mean(), both)
  assert within((a[1:] == a[:-1]).mean(), both)


def _reference(x, s, scale, bias, rate, dtype):
  """XLA's path in `dtype` with the kernel's mask: the sum, then LayerNorm."""
  index = jnp.arange(x.size, dtype=jnp.uint32).reshape(x.shape)
  keep = residual_norm.keep_mask((KEY[0], KEY[1]), index, rate) if rate else True
  return residual_norm.reference(x, s, scale, bias, keep, rate=rate, epsilon=EPSILON,
                              dtype=dtype)


def _values_and_gradients(f, x, s, scale, bias, cotangent):
  y, pull = jax.vjp(f, x, s, scale, bias)
  return dict(zip(("y", "dx", "ds", "dscale", "dbias"), (y, *pull(cotangent.astype(y.dtype)))))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rate", [0.0, 0.1])
def test_the_fused_residual_norm_and_its_gradients_are_as_accurate_as_xla_s(dtype, rate):
  """Rows and d (5 x 61 x 24: d padded to 32; 305 rows, three programs of 128, the last
  part padding) that fill no tile;
  the output and the gradients of x, s, the scale and the bias, against float64 with
  the same mask; a dropped element gets no gradient in s."""
  keys = jax.random.split(jax.random.key(0), 5)
  x = jax.random.normal(keys[0], (5, 61, 24)).astype(dtype)
  s = (2 * jax.random.normal(keys[1], (5, 61, 24))).astype(dtype)
  scale = 1 + 0.2 * jax.random.normal(keys[2], (24,))
  bias = 0.2 * jax.random.normal(keys[3], (24,))
  cotangent = jax.random.normal(keys[4], x.shape)
  with jax.enable_x64(True):
    f64 = lambda v: v.astype(jnp.float64)
    truth = _values_and_gradients(lambda *a: _reference(*a, rate, jnp.float64), f64(x),
                                  f64(s), f64(scale), f64(bias), f64(cotangent))
  control = _values_and_gradients(lambda *a: _reference(*a, rate, jnp.dtype(dtype)), x, s,
                                  scale, bias, cotangent)
  fused = lambda x, s, scale, bias: residual_norm.residual_norm(
      x, s, scale, bias, KEY, rate=rate, epsilon=EPSILON, interpret=strict_interpreter())
  got = _values_and_gradients(fused, x, s, scale, bias, cotangent)
  assert got["y"].dtype == got["dx"].dtype == got["ds"].dtype == jnp.dtype(dtype)
  assert_within_rounding({k: relative_difference(got[k], truth[k]) for k in got},
                         {k: relative_difference(control[k], truth[k]) for k in got})
  if rate:
    assert np.all(np.asarray(got["ds"])[np.asarray(truth["ds"]) == 0] == 0)
    assert (np.asarray(truth["ds"]) == 0).mean() == pytest.approx(rate, abs=0.03)
