"""The paper's base model on WMT14 EN-DE, its learning rate and warmup searched with
each trial on 2 nodes of 8 GPUs (trial_devices=16: a SLURM array task of 2 nodes a
trial, its 16 processes one JAX run), until 12 trials or 150 GPU-hours are spent,
whichever comes first. The launcher's dry run of experiments/base_reproduction.py with
--nodes=2 --gpus_per_node=8 estimates a whole trial at 8.3 GPU-hours on H100s (a lower
bound); successive halving stops most trials well before their end.

  python -m launch --experiment=experiments/base_search.py --target=slurm \
      --root=/shared/runs --gpus_per_node=8 --max_running=3 --dry_run
  python -m launch.results --experiment=experiments/base_search.py --root=/shared/runs
"""

from launch import search

CONFIG = "configs/transformer.py:base"

SEARCH = search.Search(
    space={"optimizer.learning_rate_multiplier": search.log_uniform(0.5, 2.0),
           "optimizer.warmup_steps": search.integer(2000, 8000, log=True)},
    metric="eval/loss", trials=12, device_hours=150, trial_devices=16, seed=0)
