"""When the loop logs, evaluates and checkpoints: a pure function of the step, so every
process and a resumed run agree on it. (Not clu's PeriodicAction: it keeps the previous
step and time, and its every_secs trigger would differ between processes.)"""


def due(step: int, every: int, last: int) -> bool:
  """A cadence of `every` steps (0: never) that always includes the last step."""
  return step == last or (every > 0 and step % every == 0)
