"""Learning-rate multiplier x warmup on Multi30k EN-DE (the CPU-sized model).

Offline, point the data at a folder holding Multi30k's six plain files (docs/data.md):
  python -m launch --experiment=experiments/multi30k_lr_warmup.py \
      --set=data.manual_dir=/data/multi30k
"""

from launch import sweep

CONFIG = "configs/transformer.py:multi30k"


def trials():
  return sweep.grid({"optimizer.learning_rate_multiplier": [0.5, 1.0, 2.0],
                     "optimizer.warmup_steps": [400, 800, 1600]})
