"""The train state and the steps: one sharded Adam update, one evaluation batch.

`create_train_state` initialises the state straight into its shardings;
`train_step` and `eval_step` are pure functions, jitted with explicit shardings by
`jit_steps`. Both return `metrics` collections (clu), summed over real target tokens.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training import train_state

from transformer_jax import checkpoint, config as config_lib, kernels, partitioning
from transformer_jax.kernels import placement
from transformer_jax.model import losses
from transformer_jax.model.transformer import init_params, Transformer
from transformer_jax.training import metrics

TrainState = train_state.TrainState


def _init_fn(model: Transformer, tx: optax.GradientTransformation, perturb_ulps: int = 0):
  def init(rng):  # Parameters (and so Adam's moments) carry logical axis names.
    params = jax.tree.map(lambda p: perturb(p, perturb_ulps), init_params(model, rng))
    return TrainState.create(apply_fn=model.apply, params=params, tx=tx)
  return init


def perturb(x: jax.Array, ulps: int) -> jax.Array:
  """`x` moved `ulps` representable values up (train.perturb_init_ulps): only rounding."""
  for _ in range(ulps):
    x = jax.lax.nextafter(x, jnp.full_like(x, jnp.inf))
  return x


def create_train_state(model: Transformer, tx: optax.GradientTransformation,
                       mesh: jax.sharding.Mesh, rng: jax.Array,
                       rules=config_lib.DEFAULT_LOGICAL_AXIS_RULES, perturb_ulps: int = 0
                       ) -> tuple[TrainState, TrainState]:
  """Initialises the state directly into its shardings (no full copy on one host);
  `perturb_ulps`: train.perturb_init_ulps.

  Returns (state, shardings), both TrainState-shaped.
  """
  init = _init_fn(model, tx, perturb_ulps)
  shardings = partitioning.logical_shardings(jax.eval_shape(init, rng), mesh, rules)
  # Traced outside `partitioning.activate`: out_shardings place the result, and Flax
  # would check each kernel's initialiser against the active mesh while tracing.
  state = jax.jit(lambda r: nn.meta.unbox(init(r)), out_shardings=shardings)(rng)
  return state, shardings


def abstract_train_state(model: Transformer, tx: optax.GradientTransformation,
                         mesh: jax.sharding.Mesh, rules) -> TrainState:
  """The train state's shapes, dtypes and shardings, allocating nothing."""
  boxed = jax.eval_shape(_init_fn(model, tx), jax.random.key(0))
  return checkpoint.abstract_with_shardings(
      nn.meta.unbox(boxed), partitioning.logical_shardings(boxed, mesh, rules))


@dataclasses.dataclass(frozen=True)
class Loss:
  """How the output projection and the loss are computed (same numbers to rounding)."""
  chunk_length: int = 0  # train.loss_chunk_length: positions at a time; 0: all at once.
  kernel: str = "xla"  # train.loss_kernel.

  @classmethod
  def of(cls, cfg: config_lib.Config) -> Loss:
    return cls(cfg.train.loss_chunk_length, cfg.train.loss_kernel)


def _refuse_gpu_kernels_on_tpus(cfg: config_lib.Config, mesh: jax.sharding.Mesh) -> None:
  """A kernel option with no kernels for a TPU (kernels.KERNELS says which): on a TPU
  mesh, one line naming the option, before anything compiles."""
  if mesh.devices.flat[0].platform != "tpu":
    return
  for kernel in kernels.selected(kernels.option_values(cfg)):
    if why := kernels.refusal(kernel, "tpu"):
      raise config_lib.InputError(why)


def metric_sums(model: Transformer, params: Any, batch: dict[str, jax.Array],
                label_smoothing: float, loss: Loss = Loss(),
                dropout_rng: jax.Array | None = None) -> dict[str, jax.Array]:
  """losses.token_metrics of the model on `batch`, with dropout when given its key; with
  `loss.chunk_length` or the Pallas kernel, no [tokens, vocab] array exists."""
  kwargs = dict(deterministic=dropout_rng is None,
                rngs=None if dropout_rng is None else {"dropout": dropout_rng})
  targets = batch["targets"]
  if not loss.chunk_length and loss.kernel == "xla":
    logits = model.apply({"params": params}, **batch, **kwargs)
    with jax.named_scope("loss"):  # Names its kernels in profiles (planning/roofline.py).
      return losses.token_metrics(logits, targets, label_smoothing)
  states = model.apply({"params": params}, **batch, project=False, **kwargs)
  if loss.kernel in ("pallas", "hybrid"):
    embedding = model.apply({"params": params}, method=Transformer.output_embedding)
    fused = functools.partial(losses.fused_token_metrics, label_smoothing=label_smoothing,
                              vocab_size=model.config.vocab_size,
                              write_gradient=loss.kernel == "hybrid")
    return _on_each_batch_shard(fused)(states, embedding, targets)
  project = lambda y: model.apply({"params": params}, y, method=Transformer.project)
  with jax.named_scope("loss"):
    return losses.chunked_token_metrics(project, states, targets, label_smoothing,
                                        loss.chunk_length)


def _on_each_batch_shard(sums_of):
  """sums_of(states, embedding, targets) on each device's rows, added over the batch's
  mesh axes. Only sums_of is in the "loss" scope: the sums' psum (and its transpose,
  which XLA fuses into the decoder's kernels on one device) would otherwise name those
  kernels the loss's in planning/roofline.py."""
  def scoped(*args):
    with jax.named_scope("loss"):  # Names its kernels in profiles (planning/roofline.py).
      return sums_of(*args)

  return placement.on_row_shards(
      lambda *args: jax.lax.psum(scoped(*args), placement.row_axes()), (True, False, True),
      False)


def train_step(state: TrainState, batch: dict[str, jax.Array], dropout_key: jax.Array, *,
               model: Transformer, label_smoothing: float, grad_accum_steps: int = 1,
               loss: Loss = Loss(), inject_nonfinite_at: tuple[int, ...] = ()
               ) -> tuple[TrainState, metrics.TrainMetrics]:
  """One Adam update on the mean label-smoothed loss over the batch's real tokens.

  With grad_accum_steps = k, the batch is split into k microbatches of strided rows
  (each device keeps an equal share of each); their gradient sums add up to the whole
  batch's, so the update equals one on the full batch.

  A step whose loss or gradient norm is not finite leaves the parameters and Adam's
  moments as they were (on device, no host sync); it counts the step, reports it in
  `skipped_steps` and adds nothing to the other metrics; the host decides when to stop
  (nonfinite.NonFiniteGuard). Not optax.apply_if_finite: it looks at the gradients
  only, applies non-finite updates after max_consecutive_errors of them, and would
  change the optimizer state's structure that checkpoints hold.
  `inject_nonfinite_at` (1-based steps) makes the loss NaN there, to test this.
  """
  rng = jax.random.fold_in(dropout_key, state.step)
  poison = jnp.where(jnp.isin(state.step + 1, jnp.asarray(inject_nonfinite_at, jnp.int32)),
                     jnp.nan, 1.0) if inject_nonfinite_at else 1.0

  def grads_and_sums(microbatch, rng):
    def summed_loss(params):
      sums = metric_sums(model, params, microbatch, label_smoothing, loss, rng)
      sums["loss"] = sums["loss"] * poison
      return sums["loss"], sums
    return jax.grad(summed_loss, has_aux=True)(state.params)

  if grad_accum_steps == 1:
    grads, sums = grads_and_sums(batch, rng)
  else:
    k = grad_accum_steps
    micro = jax.tree.map(lambda x: nn.with_logical_constraint(
        x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1),
        (None, "activation_batch", "activation_length")), batch)  # [k, rows / k, len]
    def add_microbatch(total, inputs):
      i, microbatch = inputs
      new = grads_and_sums(microbatch, jax.random.fold_in(rng, i))
      return jax.tree.map(jnp.add, total, new), None
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(
        grads_and_sums, jax.tree.map(lambda x: x[0], micro), rng))
    (grads, sums), _ = jax.lax.scan(add_microbatch, zeros, (jnp.arange(k), micro))
  with jax.named_scope("optimizer"):
    grads = jax.tree.map(lambda g: g / jnp.maximum(sums["tokens"], 1.0), grads)
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(sums["loss"]) & jnp.isfinite(grad_norm)
    new = state.apply_gradients(grads=grads)
    keep_if_not_finite = lambda new, old: jnp.where(finite, new, old)
    new = new.replace(params=jax.tree.map(keep_if_not_finite, new.params, state.params),
                      opt_state=jax.tree.map(keep_if_not_finite, new.opt_state,
                                             state.opt_state))
  sums = jax.tree.map(lambda x: jnp.where(finite, x, 0.0), sums)
  return new, metrics.TrainMetrics.from_step(sums, grad_norm, finite)


def eval_step(params: Any, batch: dict[str, jax.Array], *, model: Transformer,
              label_smoothing: float, loss: Loss = Loss()) -> metrics.EvalMetrics:
  return metrics.EvalMetrics.from_sums(metric_sums(model, params, batch, label_smoothing,
                                                   loss))


def jit_steps(model: Transformer, cfg: config_lib.Config, mesh: jax.sharding.Mesh,
              state_shardings: TrainState):
  """The train and eval steps, jitted with explicit shardings (state donated). XLA
  compiles each once per batch shape, on first use."""
  _refuse_gpu_kernels_on_tpus(cfg, mesh)
  batch_sh = partitioning.batch_sharding(mesh)
  replicated = partitioning.replicated(mesh)
  options = compiler_options(cfg)
  train = jax.jit(
      functools.partial(train_step, model=model, label_smoothing=cfg.train.label_smoothing,
                        grad_accum_steps=cfg.train.grad_accum_steps,
                        loss=Loss.of(cfg), inject_nonfinite_at=cfg.train.inject_nonfinite_at),
      in_shardings=(state_shardings, batch_sh, replicated),
      out_shardings=(state_shardings, replicated), donate_argnums=0,
      compiler_options=options)
  evaluate = jax.jit(
      functools.partial(eval_step, model=model, label_smoothing=cfg.train.label_smoothing,
                        loss=Loss.of(cfg)),
      in_shardings=(state_shardings.params, batch_sh), out_shardings=replicated,
      compiler_options=options)
  return train, evaluate


def compiler_options(cfg: config_lib.Config) -> dict[str, int] | None:
  """XLA options for the steps' programs: train.dot_merger=False turns the GPU
  compiler's dot merger off (other compilers ignore the option)."""
  return None if cfg.train.dot_merger else {"xla_gpu_dot_merger_threshold_mb": 0}

