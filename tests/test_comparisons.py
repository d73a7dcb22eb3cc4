"""The tests' own comparison helpers (tests/conftest.py) hold to what they promise: a
difference in either direction counts, scaled by the reference; a bound is k times a
control that really saw the perturbation; k stays tight."""

import numpy as np
import pytest

from conftest import (FLOAT32_EPS, ROUNDING_K, assert_one_line_error, assert_within_rounding,
                      max_relative_difference, relative_difference, relative_differences)


@pytest.mark.parametrize("a, b, expected", [
    ([1.0, 2.0], [1.0, 4.0], 0.5),     # Below the reference counts...
    ([1.0, 6.0], [1.0, 4.0], 0.5),     # ...as much as above it.
    ([-3.0, 0.0], [-1.0, 0.5], 2.0),   # Scaled by the largest |reference|, signs included.
    ([0.0, 10.0], [0.0, 5.0], 1.0),    # By the reference's scale, not the compared one's.
    ([0.25, 0.0], [0.0, 0.0], 0.25),   # A zero reference: the difference itself.
    (3.0, 4.0, 0.25),                  # Numbers as well as arrays.
    ([2.0, 2.0], [2.0, 2.0], 0.0),
])
def test_relative_difference_counts_either_direction_scaled_by_the_reference(a, b, expected):
  assert relative_difference(a, b) == pytest.approx(expected, rel=1e-12)
  assert relative_difference(np.asarray(a, np.float32), np.asarray(b, np.float32)) == \
      pytest.approx(expected, rel=1e-6)


def test_the_worst_tensor_and_the_worst_step_are_what_is_reported():
  a = {"x": np.array([1.0, 1.0]), "y": np.array([2.0, 3.0])}
  b = {"x": np.array([1.0, 1.0]), "y": np.array([2.0, 4.0])}
  assert max_relative_difference(a, b) == pytest.approx(0.25)
  history = [{"loss": 1.0, "lr": 1.0}, {"loss": 0.5, "lr": 2.0}, {"loss": 0.3, "lr": 3.0}]
  reference = [{"loss": 1.0, "lr": 1.0}, {"loss": 0.4, "lr": 2.0}, {"loss": 0.3, "lr": 3.0}]
  assert relative_differences(history, reference, ["loss"]) == {"loss": pytest.approx(0.25)}
  with pytest.raises(ValueError):  # A run that logged fewer steps is not compared short.
    relative_differences(history[:2], reference, ["loss"])


def test_a_difference_within_k_times_its_control_passes_and_beyond_it_fails():
  control = {"loss": 1e-5, "parameters": 2e-6}
  assert_within_rounding({"loss": ROUNDING_K * 1e-5, "parameters": 0.0}, control)
  for name in control:
    beyond = {**{n: 0.0 for n in control}, name: 1.01 * ROUNDING_K * control[name]}
    with pytest.raises(AssertionError):
      assert_within_rounding(beyond, control)


def test_k_stays_tight():
  """10 leaves room for another machine's rounding (measured ratios 0 to 3.4) and none
  for a change of mathematics (3,000 times and more): not looser."""
  assert 3.4 < ROUNDING_K <= 10.0


def test_a_control_that_saw_no_difference_bounds_nothing():
  """A perturbation that changed nothing gives controls of 0 everywhere: the comparison
  is refused rather than passed, whatever the differences."""
  with pytest.raises(AssertionError, match="the control saw no difference"):
    assert_within_rounding({"loss": 0.0}, {"loss": 0.0})


def test_a_control_below_float32_resolution_counts_as_that_resolution():
  """A control of 1e-12 cannot be resolved in float32: the bound is k x FLOAT32_EPS."""
  control = {"loss": 1e-12, "other": 1.0}
  assert_within_rounding({"loss": ROUNDING_K * FLOAT32_EPS, "other": 0.0}, control)
  with pytest.raises(AssertionError):
    assert_within_rounding({"loss": 1.01 * ROUNDING_K * FLOAT32_EPS, "other": 0.0}, control)


@pytest.mark.parametrize("code, err, passes", [
    (2, "error: --workdir is required\n", True),
    (2, "I1128 log line\nerror: --workdir is required\nW1128 log line\n", True),
    (1, "error: --workdir is required\n", False),        # Not exit 2.
    (2, "error: --output is required\n", False),         # Not the phrase.
    (2, "error: --workdir is required\nand more\n", False),  # Two lines.
    (2, "Traceback (most recent call last):\nerror: --workdir is required\n", False),
    (2, "", False),
])
def test_a_one_line_error_is_exit_2_one_line_and_the_phrase(code, err, passes):
  if passes:
    assert_one_line_error(code, err, "--workdir is required")
  else:
    with pytest.raises(AssertionError):
      assert_one_line_error(code, err, "--workdir is required")
