"""The mesh and its rules (transformer_jax/partitioning.py): each process's share of a
batch, and sharded training on 8 simulated CPU devices equal to training on one."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from conftest import assert_within_rounding, max_relative_difference, relative_differences
from conftest import SMOOTH_ACTIVATION, smoke_config
from transformer_jax import partitioning
from transformer_jax.training import metrics, run as run_lib


VOCAB = 40


def _batch(step, rows=8, length=16):
  rng = np.random.default_rng(step)
  lengths = rng.integers(3, length, size=(2, rows))
  make = lambda ls: np.stack([np.pad(rng.integers(3, VOCAB, size=n), (0, length - n))
                              for n in ls]).astype(np.int32)
  return {"inputs": make(lengths[0]), "targets": make(lengths[1])}


def _train(mesh, steps=3, grad_accum_steps=1, dropout_rate=0.1, scan_layers=False,
           perturb_init_ulps=0, loss_kernel="xla", norm_kernel="xla", ffn_kernel="xla",
           activation=SMOOTH_ACTIVATION):
  """The state after `steps` updates on `_batch(0)`, `_batch(1)`, ... on `mesh`, and each
  step's metrics. After the first step Adam's update is no longer about lr * sign(g),
  so the parameters depend on the gradients' sizes, not only their signs."""
  # Adam's epsilon at 1e-4 and a smooth activation, as COMPARABLE_RUNS (conftest) says.
  cfg = smoke_config(vocab_size=VOCAB, train={"grad_accum_steps": grad_accum_steps,
                                               "perturb_init_ulps": perturb_init_ulps,
                                               "loss_kernel": loss_kernel},
                     model={"dropout_rate": dropout_rate, "scan_layers": scan_layers,
                            "norm_kernel": norm_kernel, "ffn_kernel": ffn_kernel,
                            "activation": activation},
                     optimizer={"epsilon": 1e-4})
  run, state = run_lib.make_run(cfg, mesh)
  history = []
  with run.activate():
    for step in range(steps):
      state, out = run.train_step(state, partitioning.shard_batch(_batch(step), mesh),
                                  run.dropout_key)
      history.append(metrics.summary(out))
  return state, history


def _differences(run, reference) -> dict[str, float]:
  """Each step's loss and gradient norm (the whole gradient's size), and the parameters
  after the last step, relative to the reference's; token counts must be equal."""
  (state, history), (ref_state, ref_history) = run, reference
  assert [h["tokens"] for h in history] == [h["tokens"] for h in ref_history]
  return {**relative_differences(history, ref_history, ("loss", "grad_norm")),
          "params": max_relative_difference(jax.device_get(state.params),
                                            jax.device_get(ref_state.params))}


def _assert_same_training(run, reference, control):
  """`run` trains as the one-device `reference` does, to within ROUNDING_K times the
  `control`: the reference with its initial parameters one ulp away (conftest)."""
  assert_within_rounding(_differences(run, reference), _differences(control, reference))


def _one_device():
  return partitioning.make_mesh((1, 1, 1), jax.devices()[:1])


@pytest.fixture(scope="module")
def single_device():
  """The reference and its control."""
  return _train(_one_device()), _train(_one_device(), perturb_init_ulps=1)


@pytest.fixture(scope="module")
def single_device_without_dropout():
  """The reference and its control, without dropout."""
  return (_train(_one_device(), dropout_rate=0.0),
          _train(_one_device(), dropout_rate=0.0, perturb_init_ulps=1))


@pytest.mark.parametrize("shape", [(8, 1, 1), (2, 4, 1), (2, 2, 2)])
def test_sharded_steps_equal_single_device_steps(single_device, shape):
  assert jax.device_count() == 8
  _assert_same_training(_train(partitioning.make_mesh(shape)), *single_device)


@pytest.mark.parametrize("kernel", ["pallas", "hybrid"])
@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 2, 2)])
def test_the_fused_loss_kernel_trains_as_xla_does_on_one_device_and_sharded(
    single_device, shape, kernel):
  """train.loss_kernel="pallas" or "hybrid" (its kernels interpreted on the CPU), on one
  device and on a mesh that splits the rows four ways and the embedding over fsdp and
  tensor (each device runs the kernel on its rows with the whole embedding): the same
  training as XLA's loss on one device, to rounding."""
  mesh = partitioning.make_mesh(shape, jax.devices()[:shape[0] * shape[1] * shape[2]])
  _assert_same_training(_train(mesh, loss_kernel=kernel), *single_device)


def test_the_fused_residual_norm_trains_as_xla_does_without_dropout(
    single_device_without_dropout):
  """model.norm_kernel="pallas" (interpreted on the CPU), dropout off, on a mesh that
  splits the rows four ways and the embedding over fsdp and tensor: the same training
  as XLA's LayerNorm on one device, to rounding."""
  run = _train(partitioning.make_mesh((2, 2, 2)), dropout_rate=0.0, norm_kernel="pallas")
  _assert_same_training(run, *single_device_without_dropout)


def test_the_fused_residual_norms_dropout_does_not_depend_on_the_devices():
  """With dropout, the kernel draws its own masks: each element's bits follow its place
  in the whole batch, so training on 8 devices equals training on one, to rounding."""
  reference = _train(_one_device(), norm_kernel="pallas")
  control = _train(_one_device(), norm_kernel="pallas", perturb_init_ulps=1)
  run = _train(partitioning.make_mesh((2, 2, 2)), norm_kernel="pallas")
  _assert_same_training(run, reference, control)


@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 2, 2)])
def test_the_ffn_kernel_trains_as_xla_does_on_one_device_and_sharded(shape):
  """model.ffn_kernel="pallas" (interpreted on the CPU), with dropout, on one device and
  on a mesh that splits the rows four ways and d_ff over tensor (each device runs the
  kernel on its rows with the whole W2): the same parameters (one tree, one
  initialization) and the same step as XLA's ReLU feed-forward layers on that mesh, to
  rounding. One step: the kernel's subject is the ReLU, whose units rounding could
  flip once two runs' parameters differ (conftest); from the same parameters both
  compute the forward alike, XLA's, and differ only in the gradient's rounding."""
  mesh = partitioning.make_mesh(shape, jax.devices()[:shape[0] * shape[1] * shape[2]])
  relu = lambda **kw: _train(mesh, steps=1, activation="relu", **kw)
  _assert_same_training(relu(ffn_kernel="pallas"), relu(), relu(perturb_init_ulps=1))


def test_parameters_and_optimizer_state_are_laid_out_by_the_rules():
  state, _ = _train(partitioning.make_mesh((2, 2, 2)), steps=1)
  query = state.params["encoder_0"]["self_attention"]["query"]  # [embed, heads, kv]
  assert query.sharding.spec == P("fsdp", "tensor", None)
  assert query.addressable_shards[0].data.shape == (16, 2, 8)
  wi = state.params["decoder_0"]["ffn"]["wi"]["kernel"]  # [embed, mlp]
  assert wi.sharding.spec == P("fsdp", "tensor")
  embed = state.params["embed"]["embedding"]  # [vocab, embed]
  assert embed.sharding.spec == P("tensor", "fsdp")
  adam_mu = state.opt_state[0].mu["embed"]["embedding"]
  assert adam_mu.sharding.spec == P("tensor", "fsdp")  # FSDP shards optimizer state too.


def test_activations_are_split_by_rows_over_data_and_fsdp():
  """The rules place every activation's batch axis over (data, fsdp) and its heads over
  tensor: read from the constraints of the lowered forward pass (the numbers alone
  would not change if the rows went elsewhere, only the communication would)."""
  import re
  import flax.linen as nn
  import jax.numpy as jnp
  from transformer_jax.model.transformer import Transformer
  cfg = smoke_config(vocab_size=VOCAB)
  model, x = Transformer(cfg.model), jnp.ones((8, 16), jnp.int32)
  with partitioning.activate(partitioning.make_mesh((2, 2, 2)), cfg.train.logical_axis_rules):
    params = jax.eval_shape(lambda: nn.meta.unbox(model.init(jax.random.key(0), x, x)["params"]))
    text = jax.jit(lambda p: model.apply({"params": p}, x, x)).lower(params).as_text()
  placements = re.findall(r"sharding_constraint %\w+ <@mesh, \[(.*)\]>", text)
  layers = cfg.model.num_encoder_layers + cfg.model.num_decoder_layers
  assert len(placements) >= 4 * layers  # Each attention's q, k, v and output at least.
  assert all(p.startswith('{"data", "fsdp"}') for p in placements), set(placements)
  assert any('{"tensor"}' in p for p in placements)


@pytest.mark.slow
def test_scanned_layers_shard_and_train_like_one_device():
  """model.scan_layers: the stacked axis is replicated, the others follow the rules."""
  reference = _train(_one_device(), scan_layers=True)
  control = _train(_one_device(), scan_layers=True, perturb_init_ulps=1)
  run = _train(partitioning.make_mesh((2, 2, 2)), scan_layers=True)
  query = run[0].params["encoder_stack"]["layer"]["self_attention"]["query"]
  assert query.sharding.spec == P(None, "fsdp", "tensor", None)  # [layers, embed, ...]
  _assert_same_training(run, reference, control)


def test_gradient_accumulation_equals_one_big_batch(single_device_without_dropout):
  # Without dropout: each microbatch draws its own dropout masks.
  run = _train(partitioning.make_mesh((2, 1, 1), jax.devices()[:2]), grad_accum_steps=4,
               dropout_rate=0.0)
  _assert_same_training(run, *single_device_without_dropout)


def test_a_non_finite_step_leaves_parameters_and_adam_moments_unchanged():
  """README, "Non-finite loss or gradients": a skipped step only counts itself."""
  mesh = _one_device()
  cfg = smoke_config(vocab_size=VOCAB, train={"inject_nonfinite_at": (2,)})
  run, state = run_lib.make_run(cfg, mesh)
  with run.activate():
    state, first = run.train_step(state, partitioning.shard_batch(_batch(0), mesh),
                                  run.dropout_key)
    before = jax.device_get((state.params, state.opt_state))
    state, skipped = run.train_step(state, partitioning.shard_batch(_batch(1), mesh),
                                    run.dropout_key)
  first, skipped = metrics.summary(first), metrics.summary(skipped)
  assert (first["skipped_steps"], skipped["skipped_steps"]) == (0, 1)
  assert int(state.step) == 2 and skipped["loss"] == skipped["tokens"] == 0.0
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(
      (state.params, state.opt_state)), before)


def test_mesh_shape_errors_name_the_problem():
  with pytest.raises(ValueError, match=r"needs 16 devices; 8 are available"):
    partitioning.make_mesh((4, 4, 1))
  with pytest.raises(ValueError, match="at most one -1"):
    partitioning.make_mesh((-1, -1, 1))
  assert dict(partitioning.make_mesh((-1, 2, 1)).shape) == {"data": 4, "fsdp": 2, "tensor": 1}


def test_each_process_gets_a_disjoint_share_of_the_global_batch():
  batch = {"inputs": np.arange(16).reshape(8, 2)}
  shares = [partitioning.local_rows(batch, p, 4)["inputs"] for p in range(4)]
  np.testing.assert_array_equal(np.concatenate(shares), batch["inputs"])
  with pytest.raises(ValueError, match="does not split over 3 processes"):
    partitioning.local_rows(batch, 0, 3)
