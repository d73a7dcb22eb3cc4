"""The paper's big model on WMT14 EN-DE (Table 2: 28.4 BLEU on newstest2014).

bfloat16 compute (float32 parameters and loss) is the practical default on current
accelerators; the paper trained in float32. After training, average the last 20:
  python -m transformer_jax.evaluate --workdir=RUNS/big_reproduction/big --average_last=20
"""

from launch import sweep

CONFIG = "configs/transformer.py:big"


def trials():
  return sweep.named(big={"model.dtype": "bfloat16"})
