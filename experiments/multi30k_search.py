"""An adaptive search on Multi30k EN-DE (the CPU-sized model): learning-rate multiplier,
warmup, dropout and label smoothing, 24 trials proposed by TPE (seeded), pruned by
successive halving at the validation BLEU of each translation pass (every 1,000 steps).

Offline, point the data at a folder holding Multi30k's six plain files (docs/data.md):
  python -m launch --experiment=experiments/multi30k_search.py \
      --set=data.manual_dir=/data/multi30k --dry_run
"""

from launch import search

CONFIG = "configs/transformer.py:multi30k"

SEARCH = search.Search(
    space={"optimizer.learning_rate_multiplier": search.log_uniform(0.5, 8.0),
           "optimizer.warmup_steps": search.integer(500, 4000, log=True),
           "model.dropout_rate": search.uniform(0.1, 0.4),
           "train.label_smoothing": search.uniform(0.0, 0.2)},
    metric="eval/bleu", trials=24, sampler="tpe", pruner="successive_halving", seed=0)
