"""Decoding (Sec. 6.1): the cache, greedy search and beam search."""

import dataclasses
import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import smoke_config, table_decoder, teacher_forced_log_prob
from transformer_jax.inference import translation
from transformer_jax.model import beam_search
from transformer_jax.model.transformer import Transformer

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
  cache = beam_search.init_cache(model, params, encoded, src, cache_len=5)
  decoder = beam_search.transformer_decoder(model, params, encoded, src)
  previous = jnp.zeros((2, 1), jnp.int32)  # The start symbol.
  for i in range(5):
    step_logits, cache = decoder.step(previous, cache, jnp.array(i))
    np.testing.assert_allclose(step_logits, full[:, i], atol=1e-5)
    previous = tgt[:, i:i + 1]


def test_beams_share_source_keys_and_a_growing_cache_equals_the_full_pass(
    tiny_model_config, rng):
  """Each sentence's cross-attention keys and values are projected
  once and shared by its beams; the self-attention cache starts short and grows
  (beam_search.cache_lengths). Each beam's cached logits still equal the full forward pass."""
  model, params = _model(tiny_model_config, rng)
  src = jnp.array([[5, 9, 3, 7, EOS, 0], [4, 8, EOS, 0, 0, 0]])
  steps, beams = 40, 2
  tgt = jax.random.randint(jax.random.key(3), (2 * beams, steps), 3, 37)
  full = model.apply({"params": params}, jnp.repeat(src, beams, axis=0), tgt)
  encoded = model.apply({"params": params}, src, method=Transformer.encode)
  cache = beam_search.init_cache(model, params, encoded, src, cache_len=32, beam_size=beams)
  heads, head_dim = tiny_model_config.num_heads, tiny_model_config.head_dim
  layer = cache["decoder_0"]
  assert layer["cross_attention"]["static_key"].shape == (2, heads, 6, head_dim)
  assert layer["self_attention"]["cached_key"].shape == (2 * beams, heads, 32, head_dim)
  decoder = beam_search.transformer_decoder(model, params, encoded, src)
  previous = jnp.zeros((2 * beams, 1), jnp.int32)
  for i in range(steps):
    if i == 32:
      cache = decoder.grow(cache, steps)
    step_logits, cache = decoder.step(previous, cache, jnp.array(i))
    np.testing.assert_allclose(step_logits, full[:, i], atol=1e-5)
    previous = tgt[:, i:i + 1]


def test_a_reselected_row_goes_on_from_its_parents_history(tiny_model_config, rng):
  """Beam search reselects hypotheses through decoder.select_rows: after it, row r's
  logits are those of the full forward pass over row rows[r]'s prefix plus r's token."""
  model, params = _model(tiny_model_config, rng)
  src = jnp.array([[5, 9, 3, 7, EOS, 0], [4, 8, EOS, 0, 0, 0]])
  beams, steps, split = 2, 8, 5
  tgt = jax.random.randint(jax.random.key(3), (2 * beams, steps), 3, 37)
  rows = jnp.array([1, 1, 3, 2])  # Both beams of sentence 0 go on from its beam 1.
  # Before step `split` the cache holds tokens 0 .. split - 2; then each row's own.
  expected_tgt = jnp.concatenate([tgt[rows, :split - 1], tgt[:, split - 1:]], axis=1)
  full = model.apply({"params": params}, jnp.repeat(src, beams, axis=0), expected_tgt)
  encoded = model.apply({"params": params}, src, method=Transformer.encode)
  cache = beam_search.init_cache(model, params, encoded, src, cache_len=steps, beam_size=beams)
  decoder = beam_search.transformer_decoder(model, params, encoded, src)
  previous = jnp.zeros((2 * beams, 1), jnp.int32)
  for i in range(steps):
    if i == split:
      cache = decoder.select_rows(cache, rows)
    step_logits, cache = decoder.step(previous, cache, jnp.array(i))
    if i >= split:
      np.testing.assert_allclose(step_logits, full[:, i], atol=1e-5)
    previous = (expected_tgt if i + 1 >= split else tgt)[:, i:i + 1]


@pytest.mark.slow
def test_growing_the_cache_does_not_change_the_search(tiny_model_config, rng, monkeypatch):
  """Beam and greedy search over 32 + 30 positions give the same outputs whether the
  cache grows from 32 positions or has all of them from the start."""
  model, params = _model(tiny_model_config, rng)
  src = jax.random.randint(jax.random.key(5), (3, 12), 3, 37)
  generate = lambda beam: beam_search.generate(params, src, model=model, beam_size=beam,
                                               alpha=0.6, max_extra_length=50, eos_id=EOS)
  assert beam_search.cache_lengths(62) == [32, 62]
  grown = [np.asarray(generate(beam)) for beam in (1, 3)]
  assert (grown[0] != 0).sum(axis=1).max() > 32  # Some output passes the first length.
  jax.clear_caches()
  monkeypatch.setattr(beam_search, "cache_lengths", lambda max_decode_len: [max_decode_len])
  for beam, expected in zip((1, 3), grown):
    np.testing.assert_array_equal(generate(beam), expected)


def test_beam_search_never_scores_below_greedy_on_a_random_model(tiny_model_config, rng):
  """Greedy's output is one hypothesis beam search weighs; with the length penalty off,
  the best of 4 beams is at least as likely as the greedy output."""
  model, params = _model(tiny_model_config, rng)
  src = jax.random.randint(jax.random.key(4), (6, 6), 3, 37)
  greedy = beam_search.generate(params, src, model=model, beam_size=1, alpha=0.0,
                                max_extra_length=5, eos_id=EOS)
  beam = beam_search.generate(params, src, model=model, beam_size=4, alpha=0.0,
                              max_extra_length=5, eos_id=EOS)

  def log_prob(outputs):  # Teacher-forced log P(outputs + EOS | src).
    targets = [ids + [EOS] + [0] * (11 - len(ids) - 1)
               for ids in beam_search.strip_after_eos(np.asarray(outputs), EOS)]
    return teacher_forced_log_prob(model, params, src, targets)

  assert (greedy != 0).sum() > 3  # A real decode, not all padding.
  assert np.all(log_prob(beam) >= log_prob(greedy) - 1e-4)


def test_every_beam_scores_its_output_as_the_full_pass_does(tiny_model_config, rng):
  """With the cache reordered between beams at every step, each of
  the n best that beam search returns scores log P(output + EOS | source) / lp(length)
  exactly as the uncached forward pass does."""
  model, params = _model(tiny_model_config, rng)
  src = jax.random.randint(jax.random.key(6), (5, 7), 3, 37)
  seqs, scores = beam_search.generate(params, src, model=model, beam_size=4, alpha=0.6,
                                      max_extra_length=8, eos_id=EOS, nbest=4)
  outputs = beam_search.strip_after_eos(np.asarray(seqs).reshape(20, -1), EOS)
  assert len({tuple(o) for o in outputs}) > 10  # Different hypotheses, mostly.
  targets = [ids + [EOS] + [0] * (16 - len(ids)) for ids in outputs]
  log_p = teacher_forced_log_prob(model, params, jnp.repeat(src, 4, axis=0), targets)
  lengths = np.array([len(ids) + 1 for ids in outputs], np.float32)
  np.testing.assert_allclose(np.asarray(scores).reshape(-1),
                             log_p / beam_search.length_penalty(lengths, 0.6), rtol=1e-4)


def _best_by_enumeration(table, tokens, alpha, max_len, form="gnmt"):
  """The highest-scoring EOS-terminated sequence of at most max_len tokens."""
  best, best_score = None, -np.inf
  for length in range(1, max_len + 1):
    for body in itertools.product(tokens, repeat=length - 1):
      seq, logp = body + (EOS,), 0.0
      for j, tok in enumerate(seq):
        with np.errstate(divide="ignore"):  # Some tokens have probability 0.
          logp += np.log(table.get(seq[:j], [0, 1.0] + [0.0] * 3)[tok])
      score = logp / beam_search.length_penalty(float(length), alpha, form)
      if score > best_score:
        best, best_score = seq, score
  return list(best), best_score


def _beam(table, vocab, beam_size, max_len, alpha, form="gnmt", within_beam=False):
  seqs, scores = beam_search.beam_search(
      table_decoder(table, vocab), jnp.zeros((beam_size, max_len), jnp.int32),
      jnp.array([max_len]), max_len, EOS, beam_size=beam_size, alpha=alpha,
      length_form=form, finish_within_beam=within_beam)
  return beam_search.strip_after_eos(np.asarray(seqs[0]), EOS), np.asarray(scores[0])


# Tokens {0: start/pad, 1: EOS, 2: a, 3: b}. Greedy takes "a" (0.6), but every
# continuation of "a" is poor, while "b EOS" has probability 0.4 * 0.9 = 0.36.
_GREEDY_MISSES = {(): [0, 0.0, 0.6, 0.4], (2,): [0, 0.3, 0.35, 0.35],
                  (3,): [0, 0.9, 0.05, 0.05], (2, 2): [0, 0.5, 0.25, 0.25],
                  (2, 3): [0, 0.5, 0.25, 0.25], (3, 2): [0, 0.5, 0.25, 0.25],
                  (3, 3): [0, 0.5, 0.25, 0.25]}


def test_beam_search_finds_the_best_sequence_greedy_misses():
  max_lengths = jnp.array([3])
  greedy = beam_search.greedy_search(table_decoder(_GREEDY_MISSES, 4),
                                     jnp.zeros((1, 3), jnp.int32), max_lengths, 3, EOS)
  expected, expected_score = _best_by_enumeration(_GREEDY_MISSES, (2, 3), 0.6, 3)
  assert expected == [3, EOS]
  assert beam_search.strip_after_eos(greedy, EOS)[0][0] == 2  # Greedy starts with "a".
  outputs, scores = _beam(_GREEDY_MISSES, 4, 4, 3, 0.6)
  assert outputs[0] == [3]
  np.testing.assert_allclose(scores[0], expected_score, rtol=1e-5)
  assert np.all(np.diff(scores) <= 0)  # Best first.


def test_search_does_not_stop_while_a_longer_hypothesis_can_still_win():
  """Sec. 6.1 "terminate early when possible", and no earlier. Beam 2, alpha 0.6: "EOS"
  (0.3) and "a EOS" (0.5 * 0.4) finish first, yet "a a EOS" (0.5 * 0.6 * 0.95), divided
  by a larger length penalty, scores best. Stopping at two finished hypotheses (the
  fairseq rule) returned the empty output. Unlisted prefixes end at once."""
  table = {(): [0, 0.3, 0.5, 0.2], (2,): [0, 0.4, 0.6, 0.0], (2, 2): [0, 0.95, 0.05, 0.0]}
  expected, score = _best_by_enumeration(table, (2, 3), 0.6, 4)
  assert expected == [2, 2, EOS]
  outputs, scores = _beam({**table, (3,): [0, 1.0, 0, 0], (2, 2, 2): [0, 1.0, 0, 0]},
                          4, 2, 4, 0.6)
  assert outputs[0] == [2, 2]
  np.testing.assert_allclose(scores[0], score, rtol=1e-5)


def test_the_length_penalties_have_their_values():
  """The paper's (GNMT) lp(|Y|) = ((5 + |Y|) / 6)^alpha (Sec. 6.1) and fairseq's
  --lenpen |Y|^alpha (decode.length_penalty_form="fairseq")."""
  assert float(beam_search.length_penalty(7.0, 0.6)) == pytest.approx(2.0 ** 0.6)
  assert float(beam_search.length_penalty(7.0, 1.0, "fairseq")) == 7.0
  assert float(beam_search.length_penalty(4.0, 0.5, "fairseq")) == 2.0


@pytest.mark.parametrize("seed,form", [(0, "gnmt"), (1, "gnmt"), (2, "gnmt"), (3, "gnmt"),
                                       (0, "fairseq"), (1, "fairseq")])
def test_a_wide_beam_finds_the_exhaustive_optimum_on_random_models(seed, form):
  """Random next-token tables over {EOS, a, b, c} up to 4 tokens: with a beam as wide
  as the number of prefixes, beam search must return the exhaustive-search optimum,
  with either length penalty."""
  rng = np.random.default_rng(seed)
  tokens, max_len, vocab = (2, 3, 4), 4, 5
  table = {}
  for length in range(max_len):
    for prefix in itertools.product(tokens, repeat=length):
      table[prefix] = [0.0, *rng.dirichlet(np.full(vocab - 1, 0.5))]  # 0: start symbol.
  for alpha in (0.0, 0.6, 1.0):
    expected, score = _best_by_enumeration(table, tokens, alpha, max_len, form)
    outputs, scores = _beam(table, vocab, len(tokens) ** (max_len - 1), max_len, alpha, form)
    assert outputs[0] == expected[:-1], (alpha, outputs[0], expected)
    np.testing.assert_allclose(scores[0], score, rtol=1e-5)


def test_output_length_is_capped_at_input_length_plus_extra(tiny_model_config, rng):
  model, params = _model(tiny_model_config, rng)
  src = jnp.array([[5, 9, EOS, 0, 0, 0], [4, 8, 6, 7, 3, EOS]])
  out = beam_search.generate(params, src, model=model, beam_size=4, alpha=0.6,
                             max_extra_length=3, eos_id=EOS)
  lengths = [len(s) + 1 for s in beam_search.strip_after_eos(np.asarray(out), EOS)]
  assert out.shape == (2, 9)
  assert lengths[0] <= 3 + 3 and lengths[1] <= 6 + 3


def test_strip_after_eos():
  assert beam_search.strip_after_eos(np.array([[5, 6, EOS, 7], [0, 4, 0, 0]]), EOS) == [[5, 6], [4]]


@pytest.mark.slow
def test_translate_keeps_order_and_batching_does_not_change_results(tmp_path, rng):
  from transformer_jax import config as config_lib
  from transformer_jax.data import number_words, tokenizer
  english, german = number_words.make_split("train", 300, 10)
  tok = tokenizer.load_or_train(str(tmp_path / "spm.model"), english + german, 60, "bpe")
  cfg = smoke_config(vocab_size=tok.vocab_size).model
  model, params = _model(cfg, rng)
  sources = english[:7]  # Different lengths, so sorting reorders them.
  settings = config_lib.DecodeConfig(beam_size=2, max_extra_length=8, batch_size=3)
  together = translation.translate(params, model, tok, sources, settings)
  one_by_one = [translation.translate(params, model, tok, [s], settings)[0] for s in sources]
  assert together == one_by_one
  assert len(set(together)) > 1

  # Spread over 8 devices (rows split over the data axis), the same translations.
  from transformer_jax import partitioning
  mesh = partitioning.make_mesh((-1, 1, 1))
  spread = jax.device_put(params, partitioning.replicated(mesh))
  assert translation.params_mesh(spread) is mesh
  assert translation.translate(spread, model, tok, sources, settings) == together
  by_tokens = dataclasses.replace(settings, batch_tokens=40)
  assert translation.translate(params, model, tok, sources, by_tokens) == together


def test_decoding_compiles_at_most_8_source_widths():
  """Widths are chosen from the sentences, at most 8 of them."""
  from transformer_jax import config as config_lib
  rng = np.random.default_rng(0)
  encoded = [list(range(1, n + 1)) for n in rng.integers(1, 200, 500)]
  decode_cfg = config_lib.DecodeConfig(batch_size=16, max_extra_length=50)
  shapes = translation.decode_input_shapes(encoded, 256, decode_cfg)
  assert len(shapes) <= 8 and max(w for _, w in shapes) == 206  # 256 - 50.
  for idx, batch in translation.decode_batches(encoded, 256, decode_cfg):
    assert all(min(len(encoded[i]), 206) <= batch.shape[1] for i in idx)
  # Under a token budget: as many sentences as fit, every one once.
  budget = dataclasses.replace(decode_cfg, batch_tokens=1024)
  seen = []
  for idx, batch in translation.decode_batches(encoded, 256, budget, row_multiple=4):
    rows, width = batch.shape
    assert rows % 4 == 0 and (rows * width <= 1024 + 3 * width or rows == 4)
    seen += idx
  assert sorted(seen) == list(range(len(encoded)))
  assert len(translation.decode_input_shapes(encoded, 256, budget)) <= 8


@pytest.mark.parametrize("sample, expected", [
    ("topk:2", [0.5 / 0.8, 0.3 / 0.8, 0, 0]),
    ("topp:0.7", [0.5 / 0.8, 0.3 / 0.8, 0, 0]),  # The likelier ones before token 2: 0.8.
    ("topp:0.85", [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0]),
    ("temperature:0.5", np.array([0.5, 0.3, 0.15, 0.05]) ** 2 / 0.365)])
def test_sampling_draws_from_the_filtered_distribution(sample, expected):
  """translate --sample (back-translation): top-k, nucleus (top-p) and temperature."""
  log_probs = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]] * 20_000))
  drawn = np.asarray(beam_search.sampler(sample, seed=0)(log_probs, jnp.array(3)))
  np.testing.assert_allclose(np.bincount(drawn, minlength=4) / len(drawn), expected,
                             atol=0.015)


def test_sampled_tokens_differ_across_steps_and_repeat_with_the_seed():
  """Step i draws with fold_in(key(seed), i): the same distribution at two steps gives
  other tokens, the same step and seed the same ones, another seed others."""
  log_probs = jnp.log(jnp.full((64, 8), 1 / 8))
  draw = lambda seed, step: np.asarray(beam_search.sampler("temperature:1.0", seed)(
      log_probs, jnp.array(step)))
  assert (draw(0, 3) == draw(0, 3)).all()
  assert (draw(0, 3) != draw(0, 4)).mean() > 0.5
  assert (draw(0, 3) != draw(1, 3)).mean() > 0.5


def test_sampled_translations_are_reproducible_from_their_seed(tiny_model_config, rng):
  model, params = _model(tiny_model_config, rng)
  src = jnp.array([[5, 9, 4, 7, EOS, 0]] * 8)
  draw = lambda seed: np.asarray(beam_search.generate(
      params, src, model=model, beam_size=4, alpha=0.6, max_extra_length=8, eos_id=EOS,
      sample="temperature:1.0", seed=seed))
  assert (draw(0) == draw(0)).all()
  assert len({tuple(row) for row in draw(0)}) > 1  # Rows draw apart,
  assert (draw(0) != draw(1)).any()  # and another seed draws other tokens.


def test_the_log_names_sampling_when_it_samples():
  """translate's log line says what decodes: sampling is not a beam search."""
  from transformer_jax import config as config_lib
  assert config_lib.DecodeConfig(sample="topp:0.9", seed=1).describe() == (
      "sampling topp:0.9, seed 1")
  assert config_lib.DecodeConfig(beam_size=4).describe() == "beam 4, length penalty 0.6"


def _favouring_padding(cfg, rng):
  """The tiny model pushed to prefer id 0 (padding, the start symbol) at every step: the
  last decoder layer's output, nearly its norm's bias v alone, meets v in id 0's (tied)
  embedding row."""
  model, params = _model(cfg, rng)
  last = f"decoder_{cfg.num_decoder_layers - 1}"
  v = jax.random.normal(jax.random.key(1), (cfg.d_model,))
  params[last]["ffn_norm"]["scale"] = params[last]["ffn_norm"]["scale"] * 0.1
  params[last]["ffn_norm"]["bias"] = v
  params["embed"]["embedding"] = params["embed"]["embedding"].at[0].set(0.5 * v)
  return model, params


@pytest.mark.parametrize("beam_size, sample", [(1, ""), (4, ""), (1, "temperature:1.0")])
def test_the_search_never_emits_the_padding_id_and_scores_as_teacher_forcing(
    tiny_model_config, rng, beam_size, sample):
  """fairseq and Marian set the padding's log-probability to -inf: id 0 would vanish
  from the output (or end it early), and teacher-forced scoring, which reads 0 as
  padding, would score something else than the search did."""
  cfg = dataclasses.replace(tiny_model_config, dropout_rate=0.0)
  model, params = _favouring_padding(cfg, rng)
  src = jax.random.randint(jax.random.key(2), (8, 6), 3, 37)
  first = model.apply({"params": params}, src, jnp.zeros((8, 1), jnp.int32))[:, 0]
  assert (np.argmax(first, axis=-1) == 0).all()  # Unmasked, every row would start with 0.

  out = beam_search.generate(params, src, model=model, beam_size=beam_size, alpha=0.0,
                             max_extra_length=5, eos_id=EOS, nbest=beam_size if beam_size > 1
                             else 0, sample=sample)
  seqs, scores = out if beam_size > 1 else (out[:, None], None)
  seqs = np.asarray(seqs)
  for row in seqs.reshape(-1, seqs.shape[-1]).tolist():
    body = row[:row.index(EOS)] if EOS in row else row
    assert body and 0 not in body, row  # Real tokens up to EOS (or the length limit).
  if scores is not None:  # Each hypothesis's score is log P(output + EOS | source).
    outputs = beam_search.strip_after_eos(seqs.reshape(8 * beam_size, -1), EOS)
    targets = [ids + [EOS] + [0] * (11 - len(ids) - 1) for ids in outputs]
    log_p = teacher_forced_log_prob(model, params, jnp.repeat(src, beam_size, axis=0),
                                    targets)
    np.testing.assert_allclose(np.asarray(scores).reshape(-1), log_p, rtol=1e-4)


def test_finish_within_beam_finishes_only_a_steps_best_beam_candidates():
  """Beam 1 ranks 2 candidates a step. "a" (0.6) comes first, "EOS" (0.4) second.
  tensor2tensor's rule (the default, the paper's code) finishes any EOS candidate
  ranked, so "EOS" (0.4) beats "a EOS" (0.6 * 0.5 = 0.3): the empty output.
  decode.finish_within_beam (fairseq's, CTranslate2's, transformers') finishes only the
  first, so "EOS" is never a hypothesis and "a EOS" wins."""
  table = {(): [0, 0.4, 0.6, 0.0], (2,): [0, 0.5, 0.3, 0.2], (2, 2): [0, 1.0, 0, 0],
           (2, 3): [0, 1.0, 0, 0]}
  outputs, scores = _beam(table, 4, 1, 3, 0.0)
  assert outputs[0] == [] and np.isclose(scores[0], np.log(0.4), atol=1e-5)
  outputs, scores = _beam(table, 4, 1, 3, 0.0, within_beam=True)
  assert outputs[0] == [2] and np.isclose(scores[0], np.log(0.3), atol=1e-5)
