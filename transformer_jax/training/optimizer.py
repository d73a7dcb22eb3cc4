"""Adam with the paper's learning-rate schedule (Sec. 5.3), or fairseq's for its recipes."""

from __future__ import annotations

import jax.numpy as jnp
import optax

from transformer_jax.config import OptimizerConfig


def inverse_sqrt_schedule(d_model: int, warmup_steps: int,
                          multiplier: float = 1.0) -> optax.Schedule:
  """lrate = multiplier * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5).

  `step` counts from 1 (the paper's convention); optax passes the number of updates
  already made, so update n (0-based) uses step n + 1.
  """
  def schedule(count):
    step = jnp.asarray(count, jnp.float32) + 1.0
    return multiplier * d_model**-0.5 * jnp.minimum(step**-0.5,
                                                    step * warmup_steps**-1.5)
  return schedule


def fairseq_inverse_sqrt_schedule(peak: float, warmup_steps: int,
                                  init: float = 1e-7) -> optax.Schedule:
  """fairseq's inverse_sqrt scheduler (fairseq/optim/lr_scheduler/
  inverse_square_root_schedule.py), for porting its recipes: the update made after
  `count` updates uses init + count (peak - init) / warmup_steps while count <
  warmup_steps, then peak sqrt(warmup_steps / count)."""
  def schedule(count):
    count = jnp.asarray(count, jnp.float32)
    warmup = init + count * (peak - init) / warmup_steps
    decay = peak * jnp.sqrt(warmup_steps / jnp.maximum(count, 1.0))
    return jnp.where(count < warmup_steps, warmup, decay)
  return schedule


def make_optimizer(cfg: OptimizerConfig, d_model: int) -> tuple[optax.GradientTransformation,
                                                                 optax.Schedule]:
  """Adam(beta1, beta2, epsilon) on the schedule, optionally after global-norm clipping."""
  if cfg.schedule == "fairseq":
    schedule = fairseq_inverse_sqrt_schedule(cfg.peak_learning_rate, cfg.warmup_steps,
                                             cfg.warmup_init_lr)
  else:
    schedule = inverse_sqrt_schedule(d_model, cfg.warmup_steps, cfg.learning_rate_multiplier)
  adam = optax.adam(schedule, b1=cfg.beta1, b2=cfg.beta2, eps=cfg.epsilon)
  if cfg.grad_clip_norm > 0:
    adam = optax.chain(optax.clip_by_global_norm(cfg.grad_clip_norm), adam)
  return adam, schedule
