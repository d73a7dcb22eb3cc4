"""The paper's big model on WMT14 EN-DE (Table 2: 28.4 BLEU on newstest2014).

bfloat16 compute (float32 parameters and loss) is the practical default on current
accelerators; the paper trained in float32. Parameters and Adam state are sharded over
every device (FSDP, `train.mesh_shape=(1,-1,1)`): compiled for v5p-64 and v4-32, it
needs a third to a half of data parallelism's memory a chip, and the compiler's
estimate of its step is shorter (docs/scaling.md has the figures, and the mixed
meshes; `launch --dry_run` prints the whole run's cost). The run ends by scoring
newstest2014 with the mean of its last 20 checkpoints beside the paper's 28.4; to score
again later:
  python -m transformer_jax.evaluate --workdir=RUNS/big_reproduction/big --split=test
"""

from launch import sweep

CONFIG = "configs/transformer.py:big"


def trials():
  return sweep.named(big={"model.dtype": "bfloat16", "train.mesh_shape": (1, -1, 1)})
