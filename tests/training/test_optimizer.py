"""Adam and the learning-rate schedule (Sec. 5.3; transformer_jax/training/optimizer.py)."""

import numpy as np
import pytest

from configs import transformer as transformer_configs
from transformer_jax import config as config_lib
from transformer_jax.training import optimizer


def test_schedule_has_the_papers_values():
  """Sec. 5.3: lrate = d^-0.5 * min(step^-0.5, step * warmup^-1.5), warmup 4000."""
  d, warmup = 512, 4000
  lr = optimizer.inverse_sqrt_schedule(d, warmup)
  at = lambda step: float(lr(step - 1))  # optax counts updates from 0; the paper from 1.
  np.testing.assert_allclose(at(1), d**-0.5 * warmup**-1.5, rtol=1e-5)
  np.testing.assert_allclose(at(warmup), d**-0.5 * warmup**-0.5, rtol=1e-5)
  np.testing.assert_allclose(at(4 * warmup), d**-0.5 * (4 * warmup)**-0.5, rtol=1e-5)
  assert at(warmup) > at(warmup - 100) and at(warmup) > at(warmup + 100)  # The peak.
  np.testing.assert_allclose(float(optimizer.inverse_sqrt_schedule(d, warmup, 2.0)(0)),
                             2 * at(1), rtol=1e-5)


def test_the_fairseq_schedule_has_fairseqs_values():
  """optimizer.schedule="fairseq", as fairseq's inverse_square_root_schedule.py steps it
  (Wu et al. 2021's recipe: --lr 0.005 --warmup-updates 2000, --warmup-init-lr 1e-7 by
  default): the update after n updates uses 1e-7 + n (0.005 - 1e-7) / 2000 during
  warmup, then 0.005 sqrt(2000 / n); and the config picks it."""
  lr = optimizer.fairseq_inverse_sqrt_schedule(0.005, 2000, 1e-7)
  for n, expected in ((0, 1e-7), (1, 1e-7 + (0.005 - 1e-7) / 2000),
                      (1999, 1e-7 + 1999 * (0.005 - 1e-7) / 2000), (2000, 0.005),
                      (8000, 0.005 * 0.5)):
    np.testing.assert_allclose(float(lr(n)), expected, rtol=1e-5)
  cfg = config_lib.OptimizerConfig(schedule="fairseq", peak_learning_rate=0.005,
                                   warmup_steps=2000)
  np.testing.assert_allclose(float(optimizer.make_optimizer(cfg, 128)[1](8000)), 0.0025,
                             rtol=1e-5)
  with pytest.raises(config_lib.InputError, match="optimizer.schedule='fair'"):
    config_lib.OptimizerConfig(schedule="fair")


@pytest.mark.parametrize("size", ["base", "big", "base_enfr", "big_enfr"])
def test_paper_configs_use_the_papers_adam(size):
  """Sec. 5.3: Adam with beta1 0.9, beta2 0.98, epsilon 1e-9, warmup 4000, no clipping."""
  opt = config_lib.parse(transformer_configs.get_config(size)).optimizer
  assert (opt.beta1, opt.beta2, opt.epsilon, opt.warmup_steps, opt.learning_rate_multiplier,
          opt.grad_clip_norm) == (0.9, 0.98, 1e-9, 4000, 1.0, 0.0)
