"""JAX's persistent compilation cache, on by default for every command: a later start of
the same programs (a resume, a sweep's next trial, translate after training) loads them
from disk instead of compiling them again.

Where: --compilation_cache=DIR, else $JAX_COMPILATION_CACHE_DIR, else
$XDG_CACHE_HOME/transformer_jax/compilation (~/.cache/...); --compilation_cache=off
turns it off. Every program is kept, however quickly it compiled
($JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS changes that). The default folder and a
--compilation_cache folder are bounded: past MAX_BYTES the least recently used programs
go ($JAX_COMPILATION_CACHE_MAX_SIZE, in bytes, changes that). A folder named by
$JAX_COMPILATION_CACHE_DIR, JAX's own variable, is used as JAX uses it, unbounded: other
JAX programs may write there without the access times a bound needs (with a bound,
reading their entries fails, and their programs would compile again).
"""

from __future__ import annotations

import os

import jax

MAX_BYTES = 4 << 30


def default_directory() -> str:
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "transformer_jax", "compilation")


def enable(choice: str | None = None) -> str | None:
  """Turns the cache on in `choice` (a folder; None: the environment's or the default)
  or off ("off"); returns the folder, or None when off."""
  if choice == "off":
    jax.config.update("jax_enable_compilation_cache", False)
    return None
  shared = os.environ.get("JAX_COMPILATION_CACHE_DIR")
  directory = choice or shared or default_directory()
  jax.config.update("jax_compilation_cache_dir", directory)
  if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  if "JAX_COMPILATION_CACHE_MAX_SIZE" not in os.environ and directory != shared:
    jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
  return directory
