"""An adaptive search on the embedded numbers task (no download): the learning-rate
multiplier over 100x, the warmup and the dropout, 16 trials proposed by TPE (seeded),
5 random draws first, then TPE's proposals; evaluated every 100 of 600 steps, the losing
ones stopped early by successive halving at steps 100 and 300, each rung keeping 1 in 3
(docs/results.md: the best in half the steps of experiments/numbers_grid.py).

  python -m launch --experiment=experiments/numbers_search.py --dry_run
  python -m launch --experiment=experiments/numbers_search.py
  python -m launch.results --experiment=experiments/numbers_search.py
"""

from launch import search

CONFIG = "configs/transformer.py:numbers"

SEARCH = search.Search(
    space={"optimizer.learning_rate_multiplier": search.log_uniform(0.1, 10.0),
           "optimizer.warmup_steps": search.integer(50, 600, log=True),
           "model.dropout_rate": search.uniform(0.0, 0.3)},
    metric="eval/loss", trials=16, sampler="tpe", seed=0,
    sampler_options={"n_startup_trials": 5, "multivariate": True},
    pruner="successive_halving", first_rung=1, reduction_factor=3,
    fixed={"train.eval_every_steps": 100})
