"""A trained run restored (transformer_jax/inference/restore.py): checkpoint averaging."""

import jax
import numpy as np

from transformer_jax.inference import restore


def test_average_last_n_averages_the_last_n_of_the_kept_checkpoints(tmp_path):
  """Sec. 6.1 averages the last checkpoints: of four kept (every parameter equal to its
  step, saved and restored through Orbax), --average_last=2 is the mean of the last two,
  and with --step=30 of the two up to it (restore.chosen_params: what evaluate, export
  and translate run)."""
  import flax.linen as nn
  import orbax.checkpoint as ocp
  from conftest import smoke_config
  from transformer_jax.model.transformer import Transformer, init_params
  from transformer_jax import checkpoint
  cfg = smoke_config()
  model = Transformer(cfg.model)
  shapes = nn.meta.unbox(jax.eval_shape(lambda: init_params(model, jax.random.key(0))))
  mngr = checkpoint.manager(str(tmp_path), keep=10)
  for step in (10, 20, 30, 40):
    params = jax.tree.map(lambda x: np.full(x.shape, step, x.dtype), shapes)
    mngr.save(step, args=ocp.args.StandardSave({"params": params, "step": step}))
  mngr.wait_until_finished()
  trained = restore.TrainedModel(str(tmp_path), cfg, None, model)
  for average_last, step, mean in ((2, None, 35.0), (3, None, 30.0), (2, 30, 25.0),
                                   (1, None, 40.0)):
    params, steps, _ = restore.chosen_params(trained, average_last, step)
    assert steps == [s for s in (10, 20, 30, 40) if s <= (step or 40)][-average_last:]
    for leaf in jax.tree.leaves(params):
      np.testing.assert_allclose(np.asarray(leaf), mean, rtol=1e-6)
