"""A run's own config: `--config=configs/workdir.py:WORKDIR` is the config that run
saved (WORKDIR/config.json), so that training goes on with exactly its settings, with
any `--config.section.field=value` overrides on top. For runs made by import_model
(whose model fields came from the imported folder) and for any run whose original
command is lost:

  python -m transformer_jax.main --config=configs/workdir.py:runs/opus_en_de \
      --workdir=runs/opus_en_de --config.train.num_train_steps=2000
"""

import ml_collections

from transformer_jax import config as config_lib


def get_config(workdir: str) -> ml_collections.ConfigDict:
  return config_lib.load_workdir_config(workdir)
