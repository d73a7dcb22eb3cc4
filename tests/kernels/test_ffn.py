"""The feed-forward layer's ReLU and second product with its fused backward
(transformer_jax/kernels/ffn.py, interpreted on the CPU): max(0, z + b1) W2
(Sec. 3.3) and its gradients in z, b1 and W2 are as accurate as XLA's path (errors from
float64 truth, bounded by the control's: conftest), and ReLU's derivative is 0 where
its input is not positive, 0 included (jax.nn.relu's)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_within_rounding, relative_difference, strict_interpreter
from transformer_jax.kernels import ffn

# Small tiles, so that the sizes below span several programs each way and the walk over
# d takes two steps.
TILES = ffn.Tiles(rows=32, cols=64, depth=16)


def _values_and_gradients(f, z, bias, w, cotangent):
  y, pullback = jax.vjp(f, z, bias, w)
  dz, dbias, dw = pullback(cotangent.astype(y.dtype))
  return {"y": y, "dz": dz, "dbias": dbias, "dw": dw}


def _reference(z, bias, w):
  return jax.nn.relu(z + bias.astype(z.dtype)) @ w.astype(z.dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_ffn_kernel_and_its_gradients_are_as_accurate_as_xla_s(dtype):
  """Rows (3 x 23 = 69: three programs of 32, the last mostly padding), d_ff (200: four
  programs of 64, the last part padding) and d (24, padded to 32) that fill no tile; a
  row of z that is all zeros (no gradient but the bias's share)."""
  keys = jax.random.split(jax.random.key(0), 4)
  z = jax.random.normal(keys[0], (3, 23, 200)).at[1, 5].set(0.0).astype(dtype)
  bias = jnp.zeros((200,)).at[:100].set(0.3 * jax.random.normal(keys[1], (100,)))
  w = jax.random.normal(keys[2], (200, 24)) / 10
  cotangent = jax.random.normal(keys[3], (3, 23, 24))
  with jax.enable_x64(True):
    f64 = lambda v: v.astype(jnp.float64)
    truth = _values_and_gradients(_reference, f64(z), f64(bias), f64(w), f64(cotangent))
  control = _values_and_gradients(_reference, z, bias, w, cotangent)
  fused = lambda z, bias, w: ffn.ffn_relu_product(
      z, bias, w, interpret=strict_interpreter(), tiles=TILES)
  got = _values_and_gradients(fused, z, bias, w, cotangent)
  assert got["y"].dtype == got["dz"].dtype == jnp.dtype(dtype)
  assert got["dbias"].dtype == got["dw"].dtype == jnp.float32
  assert_within_rounding({k: relative_difference(got[k], truth[k]) for k in got},
                         {k: relative_difference(control[k], truth[k]) for k in got})
  # ReLU's derivative is 0 where z + b1 <= 0 (at 0 too), whatever dy W2^T is there.
  dead = np.asarray((z + bias.astype(z.dtype)) <= 0)
  assert dead[1, 5, 100:].all() and 0.3 < dead.mean() < 0.7
  assert np.all(np.asarray(got["dz"], np.float32)[dead] == 0)
  assert np.all(np.asarray(got["dz"], np.float32)[~dead] != 0)
