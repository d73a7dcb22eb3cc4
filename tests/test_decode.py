"""Decoding (Sec. 6.1): the cache, greedy search and beam search."""

import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from conftest import smoke_config
from transformer_jax import decode
from transformer_jax.model import Transformer

EOS = 1


def _model(cfg, rng):
  model = Transformer(cfg)
  ones = jnp.ones((2, 6), jnp.int32)
  return model, nn.meta.unbox(model.init(rng, ones, ones)["params"])


def test_cached_decoding_equals_the_full_forward_pass(tiny_model_config, rng):
  model, params = _model(tiny_model_config, rng)
  src = jnp.array([[5, 9, 3, 7, EOS, 0], [4, 8, EOS, 0, 0, 0]])
  tgt = jax.random.randint(jax.random.key(3), (2, 5), 3, 37)
  full = model.apply({"params": params}, src, tgt)
  encoded = model.apply({"params": params}, src, method=Transformer.encode)
  cache = decode.init_cache(model, params, encoded, src, max_decode_len=5)
  logits_fn = decode._transformer_logits_fn(model, params, encoded, src)
  previous = jnp.zeros((2, 1), jnp.int32)  # The start symbol.
  for i in range(5):
    step_logits, cache = logits_fn(previous, cache, jnp.array(i))
    np.testing.assert_allclose(step_logits, full[:, i], atol=1e-5)
    previous = tgt[:, i:i + 1]


def test_beam_of_one_is_greedy(tiny_model_config, rng):
  model, params = _model(tiny_model_config, rng)
  src = jax.random.randint(jax.random.key(4), (3, 6), 3, 37)
  greedy = decode.generate(params, src, model=model, beam_size=1, alpha=0.6,
                           max_extra_length=5, eos_id=EOS)
  encoded = model.apply({"params": params}, src, method=Transformer.encode)
  cache = decode.init_cache(model, params, encoded, src, 11)
  seqs, _ = decode.beam_search(decode._transformer_logits_fn(model, params, encoded, src),
                               cache, jnp.full((3,), 11), 11, EOS, beam_size=1, alpha=0.6)
  np.testing.assert_array_equal(seqs[:, 0], greedy)
  assert (greedy != 0).sum() > 3  # A real decode, not all padding.


# A hand-made model over tokens {0: start/pad, 1: EOS, 2: a, 3: b} whose best sequence
# is known: greedy takes "a" (0.6) but every continuation of "a" is poor, while
# "b EOS" has probability 0.4 * 0.9 = 0.36.
_NEXT = {(): [0, 0.0, 0.6, 0.4], (2,): [0, 0.3, 0.35, 0.35], (3,): [0, 0.9, 0.05, 0.05],
         (2, 2): [0, 0.5, 0.25, 0.25], (2, 3): [0, 0.5, 0.25, 0.25],
         (3, 2): [0, 0.5, 0.25, 0.25], (3, 3): [0, 0.5, 0.25, 0.25]}


def _toy_logits_fn(tokens, cache, i):
  """The cache is the prefix decoded so far, [n, 3]."""
  cache = jax.lax.dynamic_update_slice(cache, tokens, (0, jnp.maximum(i - 1, 0)))
  cache = jnp.where(i == 0, 0, cache)

  def row_logits(prefix):
    result = jnp.full((4,), -1e9)
    for key, probs in _NEXT.items():
      match = jnp.array(len(key) == 0) if not key else jnp.all(
          prefix[:len(key)] == jnp.array(key))
      match = match & (i == len(key))
      result = jnp.where(match, jnp.log(jnp.array(probs) + 1e-30), result)
    return result
  return jax.vmap(row_logits)(cache), cache


def _best_by_enumeration(alpha, max_len=3):
  best, best_score = None, -np.inf
  for length in range(1, max_len + 1):
    for body in itertools.product([2, 3], repeat=length - 1):
      seq, logp = body + (EOS,), 0.0
      for j, tok in enumerate(seq):
        with np.errstate(divide="ignore"):  # EOS first has probability 0.
          logp += np.log(_NEXT[seq[:j]][tok])
      score = logp / decode.length_penalty(float(length), alpha)
      if score > best_score:
        best, best_score = seq, score
  return list(best), best_score


def test_beam_search_finds_the_best_sequence_greedy_misses():
  max_lengths = jnp.array([3])
  greedy = decode.greedy_search(_toy_logits_fn, jnp.zeros((1, 3), jnp.int32), max_lengths,
                                3, EOS)
  beam_cache = jnp.zeros((4, 3), jnp.int32)
  seqs, scores = decode.beam_search(_toy_logits_fn, beam_cache, max_lengths, 3, EOS,
                                    beam_size=4, alpha=0.6)
  expected, expected_score = _best_by_enumeration(alpha=0.6)
  assert expected == [3, EOS]
  assert decode.strip_after_eos(greedy, EOS)[0][0] == 2  # Greedy starts with "a".
  assert list(np.asarray(seqs[0, 0, :2])) == expected
  np.testing.assert_allclose(scores[0, 0], expected_score, rtol=1e-5)
  assert np.all(np.diff(np.asarray(scores[0])) <= 0)  # Best first.


def test_output_length_is_capped_at_input_length_plus_extra(tiny_model_config, rng):
  model, params = _model(tiny_model_config, rng)
  src = jnp.array([[5, 9, EOS, 0, 0, 0], [4, 8, 6, 7, 3, EOS]])
  out = decode.generate(params, src, model=model, beam_size=4, alpha=0.6,
                        max_extra_length=3, eos_id=EOS)
  lengths = [len(s) + 1 for s in decode.strip_after_eos(np.asarray(out), EOS)]
  assert out.shape == (2, 9)
  assert lengths[0] <= 3 + 3 and lengths[1] <= 6 + 3


def test_strip_after_eos():
  assert decode.strip_after_eos(np.array([[5, 6, EOS, 7], [0, 4, 0, 0]]), EOS) == [[5, 6], [4]]


def test_translate_keeps_order_and_batching_does_not_change_results(tmp_path, rng):
  from transformer_jax import config as config_lib, inference, numbers, tokenizer
  english, german = numbers.make_split("train", 300, 10)
  tok = tokenizer.load_or_train(str(tmp_path / "spm.model"), english + german, 60, "bpe")
  cfg = smoke_config(vocab_size=tok.vocab_size).model
  model, params = _model(cfg, rng)
  sources = english[:7]  # Different lengths, so sorting reorders them.
  settings = config_lib.DecodeConfig(beam_size=2, max_extra_length=8, batch_size=3)
  together = inference.translate(params, model, tok, sources, settings)
  one_by_one = [inference.translate(params, model, tok, [s], settings)[0] for s in sources]
  assert together == one_by_one
  assert len(set(together)) > 1
