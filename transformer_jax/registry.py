"""Where users add variants (datasets, attention implementations, launch targets): each
is one module of a package that registers itself by name, so a new one is one file that
nothing else edits (docs/extending.md).

A config or flag names a variant; `Registry.get` imports the module of that name from
the registry's package only then, so a heavy import (TensorFlow) costs only the runs
that use it (`python -m launch` imports every target's module, for their flags).
`names()` lists the package's modules without importing them: error messages and
`--help` name every choice.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable


class Registry:
  """Variants of one kind, by name: `@REGISTRY.register("name")` in the variant's
  module, `REGISTRY.get(name, "config.data.task")` where it is used."""

  def __init__(self, kind: str, package: str):
    self.kind = kind  # What a variant is, for messages: "dataset", "launch target".
    self.package = package  # Where variants live, one module each (a dotted package name).
    self._entries: dict[str, Any] = {}

  def register(self, name: str) -> Callable[[Any], Any]:
    """A decorator that registers a class or function as the variant `name`."""
    def add(entry: Any) -> Any:
      module = getattr(entry, "__module__", "")
      home = module.removeprefix(self.package + ".").split(".")[0]
      if module.startswith(self.package + ".") and home != name:
        raise ValueError(f"{module} registers a {self.kind} as {name!r}, but a {self.kind} "
                         f"is found by its module's name: register it as {home!r} or "
                         f"name its module {name}")
      if name in self._entries and self._entries[name] is not entry:
        raise ValueError(f"two {self.kind}s are registered as {name!r}: "
                         f"{self._entries[name]!r} and {entry!r}")
      self._entries[name] = entry
      return entry
    return add

  def names(self) -> tuple[str, ...]:
    """Every variant: those registered so far and the package's public modules."""
    package = importlib.import_module(self.package)
    modules = {m.name for m in pkgutil.iter_modules(package.__path__)
               if not m.name.startswith("_")}
    return tuple(sorted(modules | set(self._entries)))

  def get(self, name: str, field: str) -> Any:
    """The variant `name` (importing its module if need be); a name that none is gets
    one line naming `field` and every valid choice."""
    if name not in self._entries and name in self.names():
      importlib.import_module(f"{self.package}.{name}")  # Registers it.
    if name not in self._entries:
      # Imported here: the config holds registries (DataConfig checks data.task), so
      # this module is imported while the config's package is.
      from transformer_jax.config.fields import InputError
      raise InputError(f"{field}={name!r} is invalid: expected one of "
                       f"{', '.join(self.names())} (a {self.kind} registered by its "
                       f"module in {self.package.replace('.', '/')}/)")
    return self._entries[name]
