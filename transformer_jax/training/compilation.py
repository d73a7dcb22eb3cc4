"""Every program a run will use, compiled before its first step and counted.

`programs_to_compile` (or `train_programs` and `decode_programs`) lowers each program
under the run's mesh exactly as the loop later calls it, `compile_ahead` compiles them
in parallel, and `count_compiles` names and times compilations (the persistent cache's
included), so a program compiled twice is seen.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import jax
import numpy as np

from transformer_jax import config as config_lib, partitioning
from transformer_jax.data import tasks
from transformer_jax.inference import translation
from transformer_jax.training import averaging
from transformer_jax.training.run import eval_rows, Run
from transformer_jax.training.step import TrainState


def compile_ahead(lowerings: Sequence[Callable[[], Any]]) -> list[Any]:
  """Compiles the programs that the `lowerings` return, on parallel threads (XLA
  compiles outside the GIL); later calls with the same shapes reuse the executables.
  Returns the compiled programs, in order (their `as_text()` for profiles)."""
  threads = min(len(lowerings), os.cpu_count() or 1, 8)  # Each compile holds memory.
  with concurrent.futures.ThreadPoolExecutor(threads) as pool:
    return list(pool.map(lambda lower: lower().compile(), lowerings))


def lowering(run: Run, fn: Callable, *args, **kwargs) -> Callable[[], Any]:
  """`fn(*args, **kwargs)` (a `.lower`) as a thunk that lowers under the run's mesh and
  rules in whichever thread calls it: the mesh context is per thread, and a program
  lowered outside it would not be the one the run later calls, so it would compile again."""
  def lower():
    with run.activate():
      return fn(*args, **kwargs)
  return lower


def _padding(run: Run, shapes: dict[str, tuple[int, ...]]) -> dict[str, jax.Array]:
  """An all-padding global batch of these shapes, sharded as the run's batches are."""
  return partitioning.shard_batch(
      {k: np.zeros(shape, np.int32) for k, shape in shapes.items()}, run.mesh)


def train_programs(run: Run, state: TrainState, shapes: Sequence[dict[str, tuple]]
                   ) -> list[Callable[[], Any]]:
  """Lowerings of the train step for each batch shape, with the real state and key."""
  return [lowering(run, run.train_step.lower, state, _padding(run, s), run.dropout_key)
          for s in shapes]


def decode_programs(run: Run, params: Any, sources: Sequence[Sequence[int]],
                    decode_cfg: config_lib.DecodeConfig) -> list[Callable[[], Any]]:
  """Lowerings of beam search for each source shape `translation.translate_ids` will
  decode `sources` (token ids) in, with parameters `params`."""
  mesh = translation.params_mesh(params)
  shapes = translation.decode_input_shapes(sources, run.cfg.model.max_len, decode_cfg, mesh)
  return [lowering(run, translation.decode_batch, params,
                   translation.place_sources(np.zeros(shape, np.int32), mesh), run.model,
                   decode_cfg, lower=True) for shape in sorted(shapes)]


def programs_to_compile(run: Run, task: tasks.Task, state: TrainState
                        ) -> list[Callable[[], Any]]:
  """Lowerings of every program the run will use: the train step for each batch shape
  the data can produce, the checkpoint average's and saver's copies and sum, the eval
  step, and beam search for each held-out batch shape.

  They lower with the real state, key and all-padding batches, exactly as the loop
  calls them, so the loop's calls find the compiled executables in jit's cache.
  """
  cfg = run.cfg
  eval_shape = (eval_rows(cfg, run.mesh), cfg.data.max_length)
  return [*train_programs(run, state, run.train_batch_shapes(task.train)),
          *(lowering(run, lower) for lower in averaging.programs(cfg.train, state)),
          lowering(run, run.eval_step.lower, state.params,
                   _padding(run, {"inputs": eval_shape, "targets": eval_shape})),
          *decode_programs(run, state.params, task.tokenizer.encode(task.eval_sources),
                           cfg.decode)]


class Compile(NamedTuple):
  name: str  # The jitted function's name, e.g. "jit(train_step)".
  seconds: float
  cached: bool  # Loaded from JAX's persistent compilation cache (compile_cache.py).


@contextlib.contextmanager
def count_compiles() -> Iterator[list[Compile]]:
  """Collects every XLA compilation inside the block, in any thread, including the
  programs JAX's persistent compilation cache supplied (`cached`)."""
  compiled, hit = [], threading.local()  # A hit is reported in the compiling thread.
  def on_event(event, **_):
    if event == "/jax/compilation_cache/cache_hits":
      hit.value = True
  def on_duration(event, duration, fun_name="?", **_):
    if event == "/jax/core/compile/backend_compile_duration":
      compiled.append(Compile(fun_name, duration, getattr(hit, "value", False)))
      hit.value = False
  jax.monitoring.register_event_listener(on_event)
  jax.monitoring.register_event_duration_secs_listener(on_duration)
  try:
    yield compiled
  finally:
    jax.monitoring.unregister_event_duration_listener(on_duration)
    jax.monitoring.unregister_event_listener(on_event)


def recompiled(ahead: Sequence[Compile], later: Sequence[Compile]) -> list[str]:
  """The names among `later` compilations of programs compiled `ahead`: programs that
  compiled again (a call that missed jit's cache). Empty when each compiled once."""
  names = {c.name for c in ahead}
  return [c.name for c in later if c.name in names]


def cache_note(compiled: Sequence[Compile]) -> str:
  """" (5 of them from the compilation cache in DIR)", or "" when none was, for logs."""
  cached = sum(c.cached for c in compiled)
  return (f" ({cached} of them from the compilation cache in "
          f"{jax.config.jax_compilation_cache_dir})" if cached else "")
