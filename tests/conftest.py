"""Test setup: 8 simulated CPU devices, set before JAX is imported anywhere."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax  # noqa: E402  (must follow the flags above)
import pytest  # noqa: E402

from transformer_jax.config import ModelConfig  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def tiny_model_config() -> ModelConfig:
  """A model small enough to compile in seconds, with every code path present."""
  return ModelConfig(vocab_size=37, d_model=32, num_heads=4, num_encoder_layers=2,
                     num_decoder_layers=2, d_ff=64, dropout_rate=0.1, max_len=64)


@pytest.fixture
def rng():
  return jax.random.key(0)
