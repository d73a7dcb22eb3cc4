"""When the loop logs, evaluates and checkpoints: a pure function of the step, so every
process and a resumed run agree on it. (Not clu's PeriodicAction: it keeps the previous
step and time, and its every_secs trigger would differ between processes.)"""


def due(step: int, every: int, last: int) -> bool:
  """A cadence of `every` steps (0: never) that always includes the last step."""
  return step == last or (every > 0 and step % every == 0)


def bleu_due(step: int, bleu_every: int, last: int, average_last: int) -> bool:
  """Held-out BLEU every `bleu_every` steps (0: never), and at the last step when the
  final evaluation translates with that step's parameters alone (average_last 1); with
  an average, the final evaluation translates instead."""
  return step == last and average_last == 1 or (bleu_every > 0 and step % bleu_every == 0)
