"""log P(target | source) of given pairs under a trained model: the training
computation without dropout (teacher forcing), as fairseq's --score-reference,
marian-scorer and sockeye-score compute it. `python -m transformer_jax.score` prints it.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.data import buckets
from transformer_jax.model.transformer import Transformer
from transformer_jax.model import losses


@functools.partial(jax.jit, static_argnames="model")
def sequence_log_probs(params: Any, inputs: jax.Array, targets: jax.Array, *,
                       model: Transformer) -> jax.Array:
  """log P(targets | inputs) per row [batch], summed over the targets' non-pad tokens
  (each target row ends with its EOS)."""
  logits = model.apply({"params": params}, inputs, targets, deterministic=True)
  return jnp.sum(losses.target_log_probs(logits, targets), axis=1)


def score_ids(params: Any, model: Transformer, sources: Sequence[Sequence[int]],
              targets: Sequence[Sequence[int]], batch_size: int = 64) -> list[float]:
  """log P(target | source) of each pair of token ids (targets end with EOS), in their
  order, in length-sorted batches of `batch_size` pairs (buckets.sorted_batches)."""
  lengths = [max(len(s), len(t)) for s, t in zip(sources, targets)]
  scores = [0.0] * len(sources)
  for idx, width, rows in buckets.sorted_batches(lengths, lambda width: batch_size,
                                                  max_width=model.config.max_len):
    values = np.asarray(sequence_log_probs(
        params, buckets.padded_rows(sources, idx, width, rows),
        buckets.padded_rows(targets, idx, width, rows), model=model))
    for row, i in enumerate(idx):
      scores[i] = float(values[row])
  return scores
