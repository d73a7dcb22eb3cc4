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


def existing_step(mngr: ocp.CheckpointManager, step: int | None = None) -> int:
  """`step` (default: the latest) if it was checkpointed; else FileNotFoundError naming
  the directory and the steps that exist."""
  steps = mngr.all_steps()
  if step is None:
    step = mngr.latest_step()
  if step is None or step not in steps:
    raise FileNotFoundError(
        f"No checkpoint {'' if step is None else f'for step {step} '}in {mngr.directory}; "
        f"available steps: {sorted(steps) or 'none'}.")
  return step


def restore(mngr: ocp.CheckpointManager, step: int, args: ocp.args.CheckpointArgs) -> Any:
  """Restores checkpoint `step` as `args` describe (shapes, shardings, which subtree)."""
  try:
    return mngr.restore(step, args=args)
  except Exception as e:  # Orbax raises several types for damaged or mismatched files.
    raise RuntimeError(f"Could not restore checkpoint step {step} from {mngr.directory} "
                       f"(does it match this config's model?): {e}") from e


def restore_state(mngr: ocp.CheckpointManager, abstract_state: Any) -> Any:
  """The latest train state, restored into the shapes and shardings given."""
  return restore(mngr, existing_step(mngr), ocp.args.StandardRestore(abstract_state))


def abstract_with_shardings(shapes: Any, shardings: Any) -> Any:
  """ShapeDtypeStructs carrying the target shardings, for restoring in place."""
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                      shapes, shardings)
