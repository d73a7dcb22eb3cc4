"""Orbax checkpoints of the train state: save every K steps, keep the last M, resume."""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp


def manager(workdir: str, keep: int, read_only: bool = False) -> ocp.CheckpointManager:
  """Checkpoints live in `workdir/checkpoints/<step>`."""
  directory = os.path.join(os.path.abspath(workdir), "checkpoints")
  options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=not read_only,
                                         read_only=read_only)
  return ocp.CheckpointManager(directory, options=options)


def restore(mngr: ocp.CheckpointManager, abstract_state: Any,
            step: int | None = None) -> Any:
  """Restores `step` (default: the latest) into the shapes and shardings given.

  Raises FileNotFoundError naming the directory and the steps that exist.
  """
  steps = mngr.all_steps()
  if step is None:
    step = mngr.latest_step()
  if step is None or step not in steps:
    raise FileNotFoundError(
        f"No checkpoint {'' if step is None else f'for step {step} '}in {mngr.directory}; "
        f"available steps: {sorted(steps) or 'none'}.")
  try:
    return mngr.restore(step, args=ocp.args.StandardRestore(abstract_state))
  except Exception as e:  # Orbax raises several types for damaged or mismatched files.
    raise RuntimeError(f"Could not restore checkpoint step {step} from {mngr.directory} "
                       f"(does it match this config's model?): {e}") from e


def abstract_with_shardings(shapes: Any, shardings: Any) -> Any:
  """ShapeDtypeStructs carrying the target shardings, for restoring in place."""
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                      shapes, shardings)
