"""Adam with the paper's learning-rate schedule (Sec. 5.3)."""

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


def make_optimizer(cfg: OptimizerConfig, d_model: int) -> tuple[optax.GradientTransformation,
                                                                 optax.Schedule]:
  """Adam(beta1, beta2, epsilon) on the schedule, optionally after global-norm clipping."""
  schedule = inverse_sqrt_schedule(d_model, cfg.warmup_steps, cfg.learning_rate_multiplier)
  adam = optax.adam(schedule, b1=cfg.beta1, b2=cfg.beta2, eps=cfg.epsilon)
  if cfg.grad_clip_norm > 0:
    adam = optax.chain(optax.clip_by_global_norm(cfg.grad_clip_norm), adam)
  return adam, schedule
