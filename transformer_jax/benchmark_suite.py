# `python -m transformer_jax.benchmark_suite`: the accelerator measurement suite that an
# offline bundle's run.sh runs. The code and its usage (--help) are in benchmarks/suite.py.
from absl import app

from transformer_jax.benchmarks import suite
from transformer_jax.benchmarks.suite import define_flags, main

__doc__ = suite.__doc__

if __name__ == "__main__":
  define_flags()
  app.run(main)
