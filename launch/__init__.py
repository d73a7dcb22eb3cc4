"""Experiments, sweeps and the launcher: `python -m launch --experiment=experiments/NAME.py`."""
