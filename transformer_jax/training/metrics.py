"""Train and eval metrics as `clu.metrics` collections.

The jitted steps return a collection built from the batch's sums over real target
tokens; the host merges the collections of a log window (or an evaluation) with one
jitted `merge` per step, and `summary` turns the merged collection into the numbers
that the logs and TensorBoard show. (No `from __future__ import annotations` here: clu
reads the metric classes from the collections' annotations.)
"""

import math

import flax
import jax
import jax.numpy as jnp
from clu import metrics


@flax.struct.dataclass
class Sum(metrics.Metric):
  """A total over the merged steps or batches."""
  total: jax.Array

  @classmethod
  def empty(cls) -> "Sum":
    return cls(total=jnp.zeros((), jnp.float32))

  def merge(self, other: "Sum") -> "Sum":
    return type(self)(total=self.total + other.total)

  def compute(self) -> jax.Array:
    return self.total


@flax.struct.dataclass
class Mean(metrics.Average):
  """clu's Average (a total over a count), read as 0 when nothing was counted."""

  def compute(self) -> jax.Array:
    return self.total / jnp.maximum(self.count, 1)


def _per_token(sums: dict[str, jax.Array]) -> dict[str, metrics.Metric]:
  tokens = sums["tokens"].astype(jnp.float32)
  return {"loss": Mean(sums["loss"], tokens), "nll": Mean(sums["nll"], tokens),
          "accuracy": Mean(sums["correct"], tokens), "tokens": Sum(tokens)}


@flax.struct.dataclass
class EvalMetrics(metrics.Collection):
  """Per real target token: the label-smoothed loss (what is minimised), the plain
  negative log-likelihood and the accuracy; and the number of tokens."""
  loss: Mean
  nll: Mean
  accuracy: Mean
  tokens: Sum

  @classmethod
  def from_sums(cls, sums: dict[str, jax.Array]) -> "EvalMetrics":
    """From `losses.token_metrics`' sums over one batch."""
    return cls.empty().replace(**_per_token(sums))


@flax.struct.dataclass
class TrainMetrics(metrics.Collection):
  """EvalMetrics' fields, the gradient's global norm averaged over the steps that
  updated, and the steps skipped for a non-finite loss or gradient."""
  loss: Mean
  nll: Mean
  accuracy: Mean
  tokens: Sum
  grad_norm: Mean
  skipped_steps: Sum

  @classmethod
  def from_step(cls, sums: dict[str, jax.Array], grad_norm: jax.Array,
                finite: jax.Array) -> "TrainMetrics":
    """One step's: `sums` are already zero when the step was not `finite`."""
    updated = finite.astype(jnp.float32)
    return cls.empty().replace(**_per_token(sums),
                               grad_norm=Mean(jnp.where(finite, grad_norm, 0.0), updated),
                               skipped_steps=Sum(1.0 - updated))


_merge = jax.jit(lambda total, new: total.merge(new))


def merge(total: metrics.Collection | None, new: metrics.Collection) -> metrics.Collection:
  """`total` merged with `new` in one jitted program (merging field by field would
  launch one per field); `new` itself when there is no total yet."""
  return new if total is None else _merge(total, new)


def summary(collection: metrics.Collection) -> dict[str, float]:
  """The collection's values as floats, with perplexity = exp(nll)."""
  values = {k: float(v) for k, v in jax.device_get(collection.compute()).items()}
  values["perplexity"] = math.exp(min(values["nll"], 80.0))
  return values
