"""The paper's base model on WMT14 EN-DE (Table 2: 27.3 BLEU on newstest2014).

The run ends by scoring newstest2014 with the mean of its last 5 checkpoints (beam 4,
alpha 0.6), paper-style and by sacreBLEU, beside the paper's 27.3; results.json and
`python -m launch.results` hold both. To score again later:
  python -m transformer_jax.evaluate --workdir=RUNS/base_reproduction/base --split=test
A rehearsal on a CPU (docs/paper.md): --smoke, with Multi30k as the training text.
"""

from launch import sweep

CONFIG = "configs/transformer.py:base"


def trials():
  return sweep.named(base={})
