"""When the loop logs, evaluates and checkpoints."""


def due(step: int, every: int, last: int) -> bool:
  """A cadence of `every` steps (0: never) that always includes the last step."""
  return step == last or (every > 0 and step % every == 0)
