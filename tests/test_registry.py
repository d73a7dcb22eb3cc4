"""transformer_jax/registry.py: a variant is found by its module's name, imported only
when a config names it, and a name that no module has is one line listing them all."""

import importlib
import sys

import pytest

from transformer_jax.config import InputError
from transformer_jax.registry import Registry


@pytest.fixture
def package(tmp_path, monkeypatch):
  """A package `variants_here` of two variant modules (one a package), the registry
  they register with, and a module whose import records that it ran."""
  root = tmp_path / "variants_here"
  (root / "beta").mkdir(parents=True)
  (tmp_path / "variants_registry.py").write_text(
      "from transformer_jax.registry import Registry\n"
      "REGISTRY = Registry('widget', 'variants_here')\n")
  (root / "__init__.py").write_text("")
  module = ("from variants_registry import REGISTRY\nIMPORTED = True\n"
            "@REGISTRY.register({name!r})\nclass Widget:\n  pass\n")
  (root / "alpha.py").write_text(module.format(name="alpha"))
  (root / "beta" / "__init__.py").write_text(module.format(name="beta"))
  (root / "_private.py").write_text("raise ImportError('never imported')\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  yield root
  for name in [m for m in sys.modules if m.startswith("variants_")]:
    del sys.modules[name]


def test_a_variant_is_imported_only_when_named_and_found_by_its_modules_name(package):
  REGISTRY = importlib.import_module("variants_registry").REGISTRY  # Made by the fixture.
  assert REGISTRY.names() == ("alpha", "beta")  # Listed without importing them.
  assert "variants_here.alpha" not in sys.modules
  assert REGISTRY.get("beta", "config.widget").__module__ == "variants_here.beta"
  assert "variants_here.alpha" not in sys.modules
  assert REGISTRY.get("alpha", "config.widget").__name__ == "Widget"


def test_an_unknown_name_is_one_line_naming_the_field_and_every_choice(package):
  REGISTRY = importlib.import_module("variants_registry").REGISTRY  # Made by the fixture.
  for name in ("gamma", "_private", "Alpha", ""):
    with pytest.raises(InputError) as e:
      REGISTRY.get(name, "config.widget")
    assert "\n" not in str(e.value)
    assert str(e.value).startswith(f"config.widget={name!r} is invalid: expected one of "
                                   "alpha, beta (a widget registered by its module in "
                                   "variants_here/)"), str(e.value)


def test_a_variant_registered_under_another_name_than_its_modules_is_refused(package):
  (package / "gamma.py").write_text(
      "from variants_registry import REGISTRY\n"
      "@REGISTRY.register('fast')\nclass Widget:\n  pass\n")
  REGISTRY = importlib.import_module("variants_registry").REGISTRY  # Made by the fixture.
  with pytest.raises(ValueError, match="register it as 'gamma' or name its module fast"):
    REGISTRY.get("gamma", "config.widget")
  twice = Registry("widget", "elsewhere")
  twice.register("one")(int)
  with pytest.raises(ValueError, match="two widgets are registered as 'one'"):
    twice.register("one")(str)
