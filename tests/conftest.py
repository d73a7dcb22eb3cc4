"""Test setup: 8 simulated CPU devices, set before JAX is imported anywhere."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Every run the tests start (subprocesses included) shares compiled programs through
# JAX's persistent cache, as a user's restarts can (README: "Compilation cache").
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  import atexit, shutil, tempfile  # noqa: E401
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="jax_cache_")
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], True)

import jax  # noqa: E402  (must follow the flags above)
import pytest  # noqa: E402

from configs import transformer as transformer_configs  # noqa: E402
from transformer_jax import config as config_lib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def smoke_config(name: str = "numbers", vocab_size: int = 37,
                 **overrides) -> config_lib.Config:
  """The shipped `NAME,smoke` config, typed, with a vocabulary and section overrides
  (`model={"dropout_rate": 0.0}`)."""
  config = transformer_configs.get_config(f"{name},smoke")
  for section, values in overrides.items():
    config[section].update(values)
  return config_lib.with_vocab(config_lib.parse(config), vocab_size)


def checkpoint_state(workdir: str, step: int):
  """A checkpoint's whole train state on one local device, whatever topology saved it."""
  import orbax.checkpoint as ocp
  path = os.path.join(workdir, "checkpoints", str(step), "default")
  checkpointer = ocp.StandardCheckpointer()
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                        checkpointer.metadata(path).item_metadata)
  return checkpointer.restore(path, target)


@pytest.fixture
def tiny_model_config() -> config_lib.ModelConfig:
  """The smoke config's model: compiles in seconds, with every code path present."""
  return smoke_config().model


@pytest.fixture
def rng():
  return jax.random.key(0)
