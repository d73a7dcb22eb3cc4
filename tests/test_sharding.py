"""Sharded training on 8 simulated CPU devices equals training on one: the jitted
steps of the training loop (train.jit_steps), on the shipped smoke config."""

import functools

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from conftest import smoke_config
from transformer_jax import optimizer, partitioning, train
from transformer_jax.model import Transformer

VOCAB = 40


def _batch(rows=8, length=16):
  rng = np.random.default_rng(0)
  lengths = rng.integers(3, length, size=(2, rows))
  make = lambda ls: np.stack([np.pad(rng.integers(3, VOCAB, size=n), (0, length - n))
                              for n in ls]).astype(np.int32)
  return {"inputs": make(lengths[0]), "targets": make(lengths[1])}


def _one_step(mesh, grad_accum_steps=1, dropout_rate=0.1, scan_layers=False):
  """The state after one update on `_batch()` on `mesh`, and the step's metrics."""
  cfg = smoke_config(vocab_size=VOCAB, train={"grad_accum_steps": grad_accum_steps},
                     model={"dropout_rate": dropout_rate, "scan_layers": scan_layers})
  model = Transformer(cfg.model)
  tx, _ = optimizer.make_optimizer(cfg.optimizer, cfg.model.d_model)
  state, shardings = train.create_train_state(model, tx, mesh, jax.random.key(0),
                                              cfg.train.logical_axis_rules)
  train_fn, _ = train.jit_steps(model, cfg, mesh, shardings)
  with partitioning.activate(mesh, cfg.train.logical_axis_rules):
    return train_fn(state, partitioning.global_batch(_batch(), mesh), jax.random.key(1))


@pytest.fixture(scope="module")
def single_device():
  return _one_step(partitioning.make_mesh((1, 1, 1), jax.devices()[:1]))


@pytest.mark.parametrize("shape", [(8, 1, 1), (2, 4, 1), (2, 2, 2)])
def test_sharded_step_equals_single_device_step(single_device, shape):
  assert jax.device_count() == 8
  state, sums = _one_step(partitioning.make_mesh(shape))
  ref_state, ref_sums = single_device
  np.testing.assert_allclose(sums["loss"], ref_sums["loss"], rtol=1e-5)
  np.testing.assert_allclose(sums["tokens"], ref_sums["tokens"])
  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=2e-4, atol=2e-6),
               jax.device_get(state.params), jax.device_get(ref_state.params))


def test_parameters_and_optimizer_state_are_laid_out_by_the_rules():
  state, _ = _one_step(partitioning.make_mesh((2, 2, 2)))
  query = state.params["encoder_0"]["self_attention"]["query"]  # [embed, heads, kv]
  assert query.sharding.spec == P("fsdp", "tensor", None)
  assert query.addressable_shards[0].data.shape == (16, 2, 8)
  wi = state.params["decoder_0"]["ffn"]["wi"]["kernel"]  # [embed, mlp]
  assert wi.sharding.spec == P("fsdp", "tensor")
  embed = state.params["embed"]["embedding"]  # [vocab, embed]
  assert embed.sharding.spec == P("tensor", "fsdp")
  adam_mu = state.opt_state[0].mu["embed"]["embedding"]
  assert adam_mu.sharding.spec == P("tensor", "fsdp")  # FSDP shards optimizer state too.


@pytest.mark.slow
def test_scanned_layers_shard_and_train_like_one_device():
  """model.scan_layers: the stacked axis is replicated, the others follow the rules."""
  ref_state, ref_sums = _one_step(partitioning.make_mesh((1, 1, 1), jax.devices()[:1]),
                                  scan_layers=True)
  state, sums = _one_step(partitioning.make_mesh((2, 2, 2)), scan_layers=True)
  np.testing.assert_allclose(sums["loss"], ref_sums["loss"], rtol=1e-5)
  query = state.params["encoder_stack"]["layer"]["self_attention"]["query"]
  assert query.sharding.spec == P(None, "fsdp", "tensor", None)  # [layers, embed, ...]
  # Sharded sums round differently; after one Adam step a few entries differ by ~4e-6.
  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=2e-4, atol=1e-5),
               jax.device_get(state.params), jax.device_get(ref_state.params))


def test_gradient_accumulation_equals_one_big_batch():
  # Without dropout: each microbatch draws its own dropout masks.
  ref_state, ref_sums = _one_step(partitioning.make_mesh((1, 1, 1), jax.devices()[:1]),
                                  dropout_rate=0.0)
  state, sums = _one_step(partitioning.make_mesh((2, 1, 1), jax.devices()[:2]),
                          grad_accum_steps=4, dropout_rate=0.0)
  np.testing.assert_allclose(sums["loss"], ref_sums["loss"], rtol=1e-5)
  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=2e-4, atol=2e-6),
               jax.device_get(state.params), jax.device_get(ref_state.params))


def test_mesh_shape_errors_name_the_problem():
  with pytest.raises(ValueError, match=r"needs 16 devices; 8 are available"):
    partitioning.make_mesh((4, 4, 1))
  with pytest.raises(ValueError, match="at most one -1"):
    partitioning.make_mesh((-1, -1, 1))
  assert dict(partitioning.make_mesh((-1, 2, 1)).shape) == {"data": 4, "fsdp": 2, "tensor": 1}
