# `python -m transformer_jax.data_benchmark`: the input pipeline alone at WMT14 size.
# The code and its usage (--help) are in benchmarks/input_pipeline.py.
from transformer_jax import cli
from transformer_jax.benchmarks import input_pipeline
from transformer_jax.benchmarks.input_pipeline import main

__doc__ = input_pipeline.__doc__

if __name__ == "__main__":
  cli.run(main)
