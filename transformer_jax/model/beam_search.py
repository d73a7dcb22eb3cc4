"""Autoregressive decoding with a key/value cache: greedy and beam search (Sec. 6.1),
and sampling.

`greedy_search` and `beam_search` work on any `Decoder`: a step from the previous
token to next-token logits with a cache, and the two things a search does to the cache
between steps (give it more positions; make each row go on from another's history when
beam search reselects its hypotheses). `generate` wires them to the Transformer. All
the search's knowledge is here: the model only keeps its cache. Everything runs inside
`jax.lax.while_loop`s (one per length the self-attention cache grows through), so a
whole batch decodes in one compiled call and stops as soon as every sentence is
finished.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.config import PAD_ID
from transformer_jax.model import attention
from transformer_jax.model.transformer import Transformer

NEG_INF = -1.0e7  # Finite, so that -inf - -inf never makes a NaN.


class Decoder(NamedTuple):
  """A model as the searches see it."""

  # (previous tokens [n, 1], cache, step i) -> (next-token logits [n, vocab], cache).
  step: Callable[[jax.Array, Any, jax.Array], tuple[jax.Array, Any]]
  # (cache, length) -> the cache with room for `length` positions.
  grow: Callable[[Any, int], Any]
  # (cache, rows [n]) -> the cache whose row r goes on from row rows[r]'s history.
  select_rows: Callable[[Any, jax.Array], Any]


def length_penalty(length: jax.Array, alpha: float, form: str = "gnmt") -> jax.Array:
  """lp(Y), which beam search divides log P(Y) by; |Y| counts the EOS. "gnmt":
  ((5 + |Y|) / 6)^alpha (Wu et al. 2016), the paper's with alpha 0.6 (Sec. 6.1);
  "fairseq": |Y|^alpha, fairseq generate's --lenpen."""
  return (length if form == "fairseq" else (5.0 + length) / 6.0) ** alpha


def _previous_tokens(seqs: jax.Array, i: jax.Array) -> jax.Array:
  """Token at position i - 1 of seqs [..., length], or the start id at i = 0."""
  prev = jax.lax.dynamic_index_in_dim(seqs, jnp.maximum(i - 1, 0), axis=-1,
                                      keepdims=False)
  return jnp.where(i == 0, PAD_ID, prev)


def _allowed(log_probs: jax.Array, force: jax.Array, eos_id: int) -> jax.Array:
  """The padding id (also the start symbol) is never emitted, as in fairseq and Marian:
  it would end the output early or vanish from it, and teacher-forced scoring, which
  drops it, would disagree with the search's score. Where `force` (a sentence at its
  length limit), every token but EOS is impossible. Not renormalized, so a
  hypothesis's score stays its log-probability under the model."""
  ids = jnp.arange(log_probs.shape[-1])
  return jnp.where((ids == PAD_ID) | (force[..., None] & (ids != eos_id)), NEG_INF,
                   log_probs)


def greedy_search(decoder: Decoder, cache: Any, max_lengths: jax.Array,
                  max_decode_len: int, eos_id: int,
                  pick: Callable[[jax.Array, jax.Array], jax.Array] | None = None
                  ) -> jax.Array:
  """Picks the most likely token each step, or `pick(log_probs, step)`'s (`sampler`).
  Returns tokens [batch, max_decode_len].

  Sentence b stops at EOS or at max_lengths[b] tokens (EOS forced there); padding
  follows.
  """
  batch = max_lengths.shape[0]

  def step(state):
    i, seqs, done = state["i"], state["seqs"], state["done"]
    logits, cache = decoder.step(_previous_tokens(seqs, i)[:, None], state["cache"], i)
    log_probs = _allowed(jax.nn.log_softmax(logits), i + 1 >= max_lengths, eos_id)
    best = jnp.argmax(log_probs, axis=-1) if pick is None else pick(log_probs, i)
    token = jnp.where(done, PAD_ID, best)
    return dict(i=i + 1, seqs=seqs.at[:, i].set(token), done=done | (token == eos_id),
                cache=cache)

  state = dict(i=jnp.array(0), seqs=jnp.zeros((batch, max_decode_len), jnp.int32),
               done=jnp.zeros((batch,), bool), cache=cache)
  return _decode_loop(step, state, max_decode_len, decoder.grow)["seqs"]


def sampler(sample: str, seed: int) -> Callable[[jax.Array, jax.Array], jax.Array]:
  """pick(log_probs [n, vocab], step) -> tokens [n], drawn from the model's distribution
  as `sample` says: "temperature:T" (log-probabilities / T), "topk:K" (among the K
  likeliest tokens) or "topp:P" (among the fewest likeliest tokens whose probability
  reaches P: nucleus sampling). Step i draws with fold_in(key(seed), i)."""
  kind, value = sample.split(":")
  value = float(value)

  def pick(log_probs, i):
    if kind == "temperature":
      z = log_probs / value
    elif kind == "topk":
      kth = jax.lax.top_k(log_probs, int(value))[0][:, -1:]
      z = jnp.where(log_probs >= kth, log_probs, NEG_INF)
    else:  # topp: keep a token if the likelier ones hold less than P.
      ranked = jnp.sort(log_probs, axis=-1)[:, ::-1]
      before = jnp.cumsum(jnp.exp(ranked), axis=-1) - jnp.exp(ranked)
      least = jnp.min(jnp.where(before < value, ranked, jnp.inf), axis=-1, keepdims=True)
      z = jnp.where(log_probs >= least, log_probs, NEG_INF)
    return jax.random.categorical(jax.random.fold_in(jax.random.key(seed), i), z, axis=-1)
  return pick


def cache_lengths(max_decode_len: int) -> list[int]:
  """Lengths the self-attention cache grows through while decoding: those of 32, 64,
  128, ... below two thirds of max_decode_len, then max_decode_len. Each step attends
  to the whole cache, so a batch that finishes early does not pay for positions it
  never reached; each length is one more loop to compile."""
  lengths = [32]
  while lengths[-1] * 3 < max_decode_len * 2:
    lengths.append(2 * lengths[-1])
  return lengths[:-1] + [max_decode_len]


def _decode_loop(step: Callable[[dict], dict], state: dict, max_decode_len: int,
                 grow: Callable[[Any, int], Any]) -> dict:
  """Runs `step` on `state` (with entries i, done, cache) until every sentence is done
  or max_decode_len steps have run, growing the cache through `cache_lengths`."""
  for length in cache_lengths(max_decode_len):
    state = {**state, "cache": grow(state["cache"], length)}
    keep_going = lambda s, length=length: (s["i"] < length) & ~jnp.all(s["done"])
    state = jax.lax.while_loop(keep_going, step, state)
  return state


def _gather_beams(x: jax.Array, beam_indices: jax.Array) -> jax.Array:
  """x [batch, beams, ...], beam_indices [batch, k] -> [batch, k, ...]."""
  return jnp.take_along_axis(x, beam_indices.reshape(beam_indices.shape + (1,) *
                                                     (x.ndim - 2)), axis=1)


def beam_search(decoder: Decoder, cache: Any, max_lengths: jax.Array,
                max_decode_len: int, eos_id: int, beam_size: int,
                alpha: float, length_form: str = "gnmt", finish_within_beam: bool = False
                ) -> tuple[jax.Array, jax.Array]:
  """Beam search with a length penalty (`length_penalty`'s `length_form`). Returns
  (tokens, scores), best first.

  tokens [batch, beam, max_decode_len], scores [batch, beam] = log P(Y) / lp(|Y|).
  `cache` holds the batch flattened with its beams: [batch * beam, ...], a row per
  beam; after each step the rows follow the surviving hypotheses (decoder.select_rows).

  Each step ranks 2 * beam candidates (so at least `beam` of them do not end in EOS):
  those ending in EOS compete with the finished hypotheses for the `beam` finished
  places, the `beam` best others stay alive. Sec. 6.1 "terminate early when possible":
  a sentence is done once no alive hypothesis can still beat its worst finished one.
  Log-probabilities only fall as tokens are added, and the length penalty grows to at
  most lp(max_lengths[b]), so an alive hypothesis ends with a score of at most
  log P(prefix) / lp(max_lengths[b]). At max_lengths[b] tokens EOS is forced.

  That is tensor2tensor's search, the paper's code. `finish_within_beam` (an option)
  finishes only EOS candidates among the best `beam` of the 2 * beam, as fairseq,
  CTranslate2 and Hugging Face's transformers do.
  """
  batch, k = max_lengths.shape[0], beam_size

  def step(state):
    i, alive_seqs, alive_logp = state["i"], state["alive_seqs"], state["alive_logp"]
    fin_seqs, fin_scores, done = state["fin_seqs"], state["fin_scores"], state["done"]
    tokens = _previous_tokens(alive_seqs, i).reshape(batch * k, 1)
    logits, cache = decoder.step(tokens, state["cache"], i)
    log_probs = jax.nn.log_softmax(logits).reshape(batch, k, -1)  # [batch, beam, vocab]
    log_probs = _allowed(log_probs, jnp.broadcast_to(
        (i + 1 >= max_lengths)[:, None], (batch, k)), eos_id)
    # The best 2 * beam of beam x vocab candidates: no beam has more than 2 * beam of
    # them, so each beam's best 2 * beam first, then the best of those.
    per_beam = min(2 * k, log_probs.shape[-1])
    beam_logp, beam_token = jax.lax.top_k(log_probs, per_beam)  # [batch, beam, per_beam]
    candidates = (alive_logp[:, :, None] + beam_logp).reshape(batch, k * per_beam)
    cand_logp, cand_index = jax.lax.top_k(candidates, 2 * k)  # [batch, 2 * beam]
    parent = cand_index // per_beam
    token = jnp.take_along_axis(beam_token.reshape(batch, k * per_beam), cand_index, axis=1)
    cand_seqs = _gather_beams(alive_seqs, parent)
    cand_seqs = jax.lax.dynamic_update_slice_in_dim(cand_seqs, token[:, :, None], i, axis=2)
    is_eos = token == eos_id

    # Finished: EOS candidates of sentences not yet done, best `beam` of old and new.
    finish = is_eos & ~done[:, None] & (cand_logp > NEG_INF / 2)
    if finish_within_beam:
      finish = finish & (jnp.arange(2 * k) < k)[None, :]  # cand_logp is sorted.
    new_scores = jnp.where(finish, cand_logp / length_penalty(i + 1.0, alpha, length_form),
                           NEG_INF)
    all_scores = jnp.concatenate([fin_scores, new_scores], axis=1)
    fin_scores, best = jax.lax.top_k(all_scores, k)
    fin_seqs = _gather_beams(jnp.concatenate([fin_seqs, cand_seqs], axis=1), best)

    # Alive: the best `beam` candidates that did not end in EOS.
    alive_logp, keep = jax.lax.top_k(jnp.where(is_eos, NEG_INF, cand_logp), k)
    alive_seqs = _gather_beams(cand_seqs, keep)
    parent_rows = jnp.arange(batch)[:, None] * k + _gather_beams(parent, keep)
    cache = decoder.select_rows(cache, parent_rows.reshape(-1))  # Their parents' history.

    # Scores are sorted, so fin_scores[:, -1] is the worst finished one (NEG_INF while
    # fewer than `beam` have finished); alive_logp[:, 0] is the best alive prefix.
    best_possible = alive_logp[:, 0] / length_penalty(max_lengths.astype(jnp.float32), alpha,
                                                      length_form)
    done = done | (best_possible < fin_scores[:, -1]) | (i + 1 >= max_lengths)
    return dict(i=i + 1, alive_seqs=alive_seqs, alive_logp=alive_logp, fin_seqs=fin_seqs,
                fin_scores=fin_scores, done=done, cache=cache)

  empty_seqs = jnp.zeros((batch, k, max_decode_len), jnp.int32)
  # Only the first beam is live at the start, so the first step expands one prefix.
  alive_logp = jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1)), (batch, 1))
  state = dict(i=jnp.array(0), alive_seqs=empty_seqs, alive_logp=alive_logp,
               fin_seqs=empty_seqs, fin_scores=jnp.full((batch, k), NEG_INF),
               done=jnp.zeros((batch,), bool), cache=cache)
  state = _decode_loop(step, state, max_decode_len, decoder.grow)
  return state["fin_seqs"], state["fin_scores"]


def transformer_decoder(model: Transformer, params: Any, encoded: jax.Array,
                        inputs: jax.Array) -> Decoder:
  """The Transformer's cached decoder over the encoder output `encoded` of `inputs`."""
  def step(tokens, cache, i):
    logits, variables = model.apply(
        {"params": params, "cache": cache}, encoded, inputs, tokens,
        jnp.full_like(tokens, i), use_cache=True, method=Transformer.decode,
        mutable=["cache"])
    return logits[:, 0].astype(jnp.float32), variables["cache"]
  return Decoder(step, attention.grow_cache, attention.select_cache_rows)


def max_len(model: Transformer | tuple[Transformer, ...]) -> int:
  """The positions a model (or every model of an ensemble) has encodings for."""
  return min(m.config.max_len for m in (model if isinstance(model, tuple) else (model,)))


def ensemble_decoder(decoders: list[Decoder]) -> Decoder:
  """The models' mean log-probabilities (the searches' log-softmax renormalizes them: a
  normalized geometric mean of the models' distributions); the cache is the tuple of
  theirs."""
  def step(tokens, caches, i):
    outputs = [d.step(tokens, cache, i) for d, cache in zip(decoders, caches)]
    log_probs = [jax.nn.log_softmax(logits) for logits, _ in outputs]
    return sum(log_probs) / len(decoders), tuple(cache for _, cache in outputs)
  grow = lambda caches, length: tuple(d.grow(c, length) for d, c in zip(decoders, caches))
  select_rows = lambda caches, rows: tuple(d.select_rows(c, rows)
                                           for d, c in zip(decoders, caches))
  return Decoder(step, grow, select_rows)


def init_cache(model: Transformer, params: Any, encoded: jax.Array, inputs: jax.Array,
               cache_len: int, beam_size: int = 1) -> Any:
  """The decoder cache for `encoded` [n, src_len, d_model], decoded as `beam_size`
  hypotheses per sentence: empty self-attention caches of `cache_len` positions for
  n x beam_size rows (the search grows them as needed), and each layer's
  cross-attention keys and values of the encoder output, projected here once per
  sentence rather than at every step and shared by the sentence's beams."""
  start = jnp.zeros((inputs.shape[0] * beam_size, 1), jnp.int32)
  _, variables = model.apply({"params": params}, encoded, inputs, start, start,
                             use_cache=True, cache_len=cache_len,
                             method=Transformer.decode, mutable=["cache"])
  return variables["cache"]


@functools.partial(jax.jit, static_argnames=("model", "beam_size", "alpha", "length_form",
                                             "max_extra_length", "eos_id", "nbest",
                                             "sample", "seed", "finish_within_beam"))
def generate(params: Any, inputs: jax.Array, *, model: Transformer, beam_size: int,
             alpha: float, max_extra_length: int, eos_id: int, nbest: int = 0,
             sample: str = "", seed: int = 0, length_form: str = "gnmt",
             finish_within_beam: bool = False) -> Any:
  """Translates inputs [batch, src_len] -> best tokens [batch, src_len + extra]; with
  `nbest` (at most beam_size) the `nbest` best: (tokens [batch, nbest, len], scores
  [batch, nbest]), best first.

  Output length is at most the input's length (non-pad tokens) + max_extra_length
  (Sec. 6.1: input length + 50). Beam 1 runs the cheaper greedy loop; `sample`
  ("topk:K", "topp:P", "temperature:T") draws each token instead (`sampler`).

  An ensemble: `model` a tuple of models and `params` the tuple of their parameters
  (one vocabulary). Each step averages their log-probabilities; each keeps its cache.
  """
  if sample and nbest:
    raise ValueError("Sampling draws one translation per source: no nbest.")
  max_decode_len = inputs.shape[1] + max_extra_length
  if max_decode_len > max_len(model):
    raise ValueError(
        f"Decoding {inputs.shape[1]} source positions + {max_extra_length} extra needs "
        f"{max_decode_len} positions; model.max_len={max_len(model)} covers fewer.")
  models, params = (model, params) if isinstance(model, tuple) else ((model,), (params,))
  max_lengths = jnp.sum(inputs != PAD_ID, axis=1) + max_extra_length
  max_lengths = jnp.minimum(max_lengths, max_decode_len)
  decoders, caches = [], []
  for one, p in zip(models, params):
    dtype = jnp.dtype(one.config.dtype)
    if dtype != jnp.float32:  # Weights cast once here, not by every step's layers.
      p = jax.tree.map(
          lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, p)
    encoded = one.apply({"params": p}, inputs, method=Transformer.encode)
    # Beams ride along the batch axis, [batch * beam, ...], except for the encoder
    # output and its keys and values, which each sentence's beams share.
    caches.append(init_cache(one, p, encoded, inputs, cache_lengths(max_decode_len)[0],
                             1 if sample else beam_size))
    decoders.append(transformer_decoder(one, p, encoded, inputs))
  decoder, cache = (decoders[0], caches[0]) if len(decoders) == 1 else (
      ensemble_decoder(decoders), tuple(caches))
  if sample or (beam_size == 1 and not nbest):
    return greedy_search(decoder, cache, max_lengths, max_decode_len, eos_id,
                         sampler(sample, seed) if sample else None)
  seqs, scores = beam_search(decoder, cache, max_lengths, max_decode_len, eos_id,
                             beam_size, alpha, length_form, finish_within_beam)
  return (seqs[:, :nbest], scores[:, :nbest]) if nbest else seqs[:, 0]


def strip_after_eos(tokens: np.ndarray, eos_id: int) -> list[list[int]]:
  """Token rows -> lists ending before the first EOS (and without padding)."""
  out = []
  for row in np.asarray(tokens).tolist():
    row = row[: row.index(eos_id)] if eos_id in row else row
    out.append([t for t in row if t != PAD_ID])
  return out
