# `python -m transformer_jax.benchmark`: training and decoding speed, MFU and memory, or
# a compile-only fit check. The code and its usage (--help) are in benchmarks/speed.py.
from transformer_jax import cli
from transformer_jax.benchmarks import speed
from transformer_jax.benchmarks.speed import define_flags, main

__doc__ = speed.__doc__

if __name__ == "__main__":
  define_flags()
  cli.run(main)
