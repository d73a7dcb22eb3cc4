"""How far the host runs ahead of the devices: batches built ahead in a thread
(`prefetch`), and at most a few steps queued (`InFlight`)."""

from __future__ import annotations

import collections
import queue
import threading
from typing import Any, Callable, Iterable, Iterator, TypeVar

import jax

T = TypeVar("T")


class InFlight:
  """Keeps the host at most `depth` steps ahead of the devices.

  JAX returns from a step before the devices finish it. Unbounded, the host queues
  programs without limit, and XLA's CPU client can deadlock: a device admits 32
  launched programs at a time, each device launches a multi-device program on its own,
  and a step whose launch on one device comes after 32 later launches waits forever in
  its all-reduce ("Termination timeout for `all reduce`"). Two steps ahead still keeps
  any accelerator fed: the next step is queued while one runs.
  """

  def __init__(self, depth: int = 2):
    self.depth, self.pending = depth, collections.deque()

  def add(self, value: Any) -> None:
    """`value`: an output of the newest step; waits for the step `depth` before it."""
    self.pending.append(value)
    while len(self.pending) > self.depth:
      jax.block_until_ready(self.pending.popleft())


def prefetch(produce: Callable[[int], T], steps: Iterable[int], depth: int = 2
             ) -> Iterator[T]:
  """produce(step) for each step, in order, computed up to `depth` steps ahead in a
  background thread: building a batch and sending it to the devices overlap the
  device's work on the previous step. An error in `produce` is raised here; closing
  the generator (a finished loop, an exception, a stop on a signal) ends the thread."""
  results: queue.Queue = queue.Queue(depth)
  stop = threading.Event()
  end = object()

  def put(item) -> bool:
    while not stop.is_set():
      try:
        results.put(item, timeout=0.05)
        return True
      except queue.Full:
        pass
    return False

  def work():
    try:
      for step in steps:
        if not put((produce(step), None)):
          return
      put((end, None))
    except BaseException as e:  # Handed to the consumer, raised there.
      put((None, e))

  thread = threading.Thread(target=work, name="prefetch", daemon=True)
  thread.start()
  try:
    while True:
      item, error = results.get()
      if error is not None:
        raise error
      if item is end:
        return
      yield item
  finally:
    stop.set()
    thread.join()
