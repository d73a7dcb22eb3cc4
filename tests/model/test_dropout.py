"""Dropout's draws as the model makes them (Flax's Dropout, Sec. 5.4): each element kept
with probability 1 - rate, the kept ones scaled so the mean is kept, and masks that are
independent across sites and devices."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P


class _Sites(nn.Module):
  """Two dropout sites of one module, as a layer's are."""
  rate: float

  @nn.compact
  def __call__(self, x):
    return [nn.Dropout(self.rate)(x, deterministic=False) for _ in range(2)]


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg"])
@pytest.mark.parametrize("rate", [0.1, 0.3])
def test_each_element_is_kept_with_its_probability_and_the_mean_is_kept(impl, rate):
  """4M elements: the kept fraction within 6 standard deviations of 1 - rate (a 1/256
  step from it would be 10), kept values 1 / (1 - rate), and two sites' masks kept
  together as often as independent draws are."""
  first, second = (np.asarray(m) for m in _Sites(rate).apply(
      {}, jnp.ones((2048, 2048)), rngs={"dropout": jax.random.key(0, impl=impl)}))
  p, n = 1 - rate, first.size
  for mask in (first, second):
    kept = mask != 0
    assert abs(kept.mean() - p) < 6 * np.sqrt(p * (1 - p) / n), kept.mean()
    np.testing.assert_allclose(np.unique(mask[kept]), [1 / p], rtol=1e-6)
  both = ((first != 0) & (second != 0)).mean()
  assert abs(both - p * p) < 6 * np.sqrt(p * p * (1 - p * p) / n), (both, p * p)


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg"])
def test_masks_differ_across_devices(impl):
  """A batch split over 8 devices: each device's rows draw their own masks."""
  mesh = jax.make_mesh((8,), ("data",))
  x = jax.device_put(jnp.ones((8, 4096)), NamedSharding(mesh, P("data")))
  key = jax.random.key(1, impl=impl)
  y = jax.jit(lambda x: nn.Dropout(0.1).apply({}, x, deterministic=False,
                                              rngs={"dropout": key}))(x)
  assert len({row.tobytes() for row in np.asarray(y) != 0}) == 8
