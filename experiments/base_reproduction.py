"""The paper's base model on WMT14 EN-DE (Table 2: 27.3 BLEU on newstest2014).

After training, score the average of the last 5 checkpoints:
  python -m transformer_jax.evaluate --workdir=RUNS/base_reproduction/base --average_last=5
"""

from launch import sweep

CONFIG = "configs/transformer.py:base"


def trials():
  return sweep.named(base={})
