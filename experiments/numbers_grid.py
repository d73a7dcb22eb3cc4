"""The grid beside experiments/numbers_search.py: the same three fields over the same
ranges, 16 points (learning-rate multiplier 0.1 to 10 in four log steps, warmup 50 or
600, dropout 0 or 0.3), every trial trained to the end (docs/results.md compares them).

  python -m launch --experiment=experiments/numbers_grid.py
"""

from launch import sweep

CONFIG = "configs/transformer.py:numbers"


def trials():
  return sweep.grid({"optimizer.learning_rate_multiplier": [0.1, 0.464, 2.154, 10.0],
                     "optimizer.warmup_steps": [50, 600],
                     "model.dropout_rate": [0.0, 0.3]})
