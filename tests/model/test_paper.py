"""The paper's equations, written again in numpy from the paper (not from the model's
code), against the model; and the beam search's ranking by GNMT's length penalty."""

import dataclasses
import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import table_decoder
from transformer_jax.model import beam_search
from transformer_jax.model.transformer import Transformer

EOS = 1


def _layer_norm(x, p, eps=1e-6):
  """LayerNorm (Ba et al. 2016) over the model dimension, with gain and bias."""
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def _multi_head(x_q, x_kv, p, visible):
  """Sec. 3.2: MultiHead(Q, K, V) = Concat(head_1..head_h) W^O with head_i =
  softmax(Q W_i^Q (K W_i^K)^T / sqrt(d_k)) V W_i^V; `visible` [q, k] says which keys
  each query may see (padding and, in the decoder, later positions: Sec. 3.2.3)."""
  heads = []
  for i in range(p["query"].shape[1]):
    q, k, v = x_q @ p["query"][:, i], x_kv @ p["key"][:, i], x_kv @ p["value"][:, i]
    scores = np.where(visible, q @ k.T / np.sqrt(q.shape[-1]), -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    heads.append(weights / weights.sum(-1, keepdims=True) @ v)
  w_o = p["out"].reshape(-1, p["out"].shape[-1])  # [h * d_v, d_model]
  return np.concatenate(heads, -1) @ w_o


def _ffn(x, p):
  """Sec. 3.3: FFN(x) = max(0, x W_1 + b_1) W_2 + b_2."""
  hidden = np.maximum(0, x @ p["wi"]["kernel"] + p["wi"]["bias"])
  return hidden @ p["wo"]["kernel"] + p["wo"]["bias"]


def _sublayer(x, fn, norm, pre_norm):
  """Sec. 3.1: LayerNorm(x + Sublayer(x)); pre-norm, the option: x + Sublayer(LN(x))."""
  return x + fn(_layer_norm(x, norm)) if pre_norm else _layer_norm(x + fn(x), norm)


def _positions(length, d):
  """Sec. 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...)."""
  pe = np.zeros((length, d))
  for pos in range(length):
    for i in range(0, d, 2):
      pe[pos, i] = np.sin(pos / 10000 ** (i / d))
      if i + 1 < d:
        pe[pos, i + 1] = np.cos(pos / 10000 ** (i / d))
  return pe


def paper_logits(p, src, tgt, num_layers, pre_norm, shared):
  """Logits [tgt_len, vocab] of one sentence pair (token ids, 0 = padding), from the
  paper: embeddings times sqrt(d_model) plus positions (Sec. 3.4-3.5), N encoder and
  decoder layers (Sec. 3.1), the decoder reading the target shifted right, the output
  projection the embedding matrix transposed when shared (Sec. 3.4)."""
  src_embed = p["embed" if shared else "source_embed"]["embedding"]
  tgt_embed = p["embed" if shared else "target_embed"]["embedding"]
  d = src_embed.shape[1]
  src_real, tgt_real = src != 0, tgt != 0
  x = src_embed[src] * np.sqrt(d) + _positions(len(src), d)
  for n in range(num_layers):
    layer = p[f"encoder_{n}"]
    visible = np.broadcast_to(src_real, (len(src), len(src)))
    x = _sublayer(x, lambda h: _multi_head(h, h, layer["self_attention"], visible),
                  layer["self_attention_norm"], pre_norm)
    x = _sublayer(x, lambda h: _ffn(h, layer["ffn"]), layer["ffn_norm"], pre_norm)
  if pre_norm:
    x = _layer_norm(x, p["encoder_norm"])
  shifted = np.concatenate([[0], tgt[:-1]])  # Starts at the start symbol, id 0.
  y = tgt_embed[shifted] * np.sqrt(d) + _positions(len(tgt), d)
  causal = np.tril(np.ones((len(tgt), len(tgt)), bool)) & tgt_real[None, :]
  cross = np.broadcast_to(src_real, (len(tgt), len(src)))
  for n in range(num_layers):
    layer = p[f"decoder_{n}"]
    y = _sublayer(y, lambda h: _multi_head(h, h, layer["self_attention"], causal),
                  layer["self_attention_norm"], pre_norm)
    y = _sublayer(y, lambda h: _multi_head(h, x, layer["cross_attention"], cross),
                  layer["cross_attention_norm"], pre_norm)
    y = _sublayer(y, lambda h: _ffn(h, layer["ffn"]), layer["ffn_norm"], pre_norm)
  if pre_norm:
    y = _layer_norm(y, p["decoder_norm"])
  return y @ (tgt_embed.T if shared else p["logits"]["kernel"])


@pytest.mark.parametrize("pre_norm", [False, True], ids=["post_norm", "pre_norm"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "untied"])
def test_logits_match_the_papers_equations_in_numpy(tiny_model_config, pre_norm, shared):
  """Sec. 3.1-3.5 in float64 numpy, on random weights (LayerNorm gains and biases too),
  for two pairs padded differently: the model's logits at every real target position."""
  cfg = dataclasses.replace(tiny_model_config, pre_norm=pre_norm, share_embeddings=shared,
                            dropout_rate=0.0)
  model = Transformer(cfg)
  src = np.array([[5, 9, 3, 7, 2, 1], [4, 8, 1, 0, 0, 0]])
  tgt = np.array([[6, 3, 9, 1, 0], [7, 2, 5, 8, 1]])
  params = jax.tree.map(np.asarray, nn.meta.unbox(
      model.init(jax.random.key(0), src, tgt)["params"]))
  rng = np.random.default_rng(0)  # Non-trivial norms, so their placement matters.
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: x + 0.3 * rng.standard_normal(x.shape).astype(x.dtype)
      if "norm" in jax.tree_util.keystr(path) else x, params)
  got = np.asarray(model.apply({"params": params}, src, tgt))
  f64 = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
  for row in range(len(src)):
    expected = paper_logits(f64, src[row], tgt[row], cfg.num_encoder_layers, pre_norm,
                            shared)
    real = tgt[row] != 0
    np.testing.assert_allclose(got[row][real], expected[real], rtol=1e-5, atol=1e-5)


def test_token_embeddings_are_multiplied_by_sqrt_d_model(tiny_model_config):
  """Sec. 3.4: "In the embedding layers, we multiply those weights by sqrt(d_model)";
  the encoder's input is then E[token] sqrt(d_model) + PE(position)."""
  cfg = dataclasses.replace(tiny_model_config, dropout_rate=0.0)
  model = Transformer(cfg)
  tokens = np.array([[5, 9, 3, 1]])
  params = nn.meta.unbox(model.init(jax.random.key(0), tokens, tokens)["params"])
  embedded = model.apply({"params": params}, tokens, jnp.arange(4)[None],
                         method=lambda m, t, pos: m.source_embedder(t, pos, deterministic=True))
  table = np.asarray(params["embed"]["embedding"])
  expected = table[tokens[0]] * np.sqrt(cfg.d_model) + _positions(4, cfg.d_model)
  np.testing.assert_allclose(np.asarray(embedded[0]), expected, rtol=1e-5, atol=1e-5)


def _gnmt(length, alpha):
  """Sec. 6.1 / Wu et al. (2016): lp(Y) = ((5 + |Y|) / 6)^alpha."""
  return ((5.0 + length) / 6.0) ** alpha


def _table_search(table, max_len, beam_size, alpha):
  """Beam search over a next-token table {prefix: probabilities} (0 start, 1 EOS)."""
  vocab = len(next(iter(table.values())))
  seqs, scores = beam_search.beam_search(
      table_decoder(table, vocab), jnp.zeros((beam_size, max_len), jnp.int32),
      jnp.array([max_len]), max_len, EOS, beam_size, alpha)
  return beam_search.strip_after_eos(np.asarray(seqs[0]), EOS), np.asarray(scores[0])


def test_beam_search_ranks_finished_hypotheses_by_gnmt_length_penalty():
  """Sec. 6.1, alpha 0.6: a one-token "EOS" with log P = -1.0 against "a a EOS" with
  log P = -1.5. GNMT's ((5 + |Y|) / 6)^alpha ranks "EOS" first (-1.0 vs -1.5 / 1.188);
  |Y|^alpha would rank "a a EOS" first (-1.5 / 1.933 = -0.78). An exhaustive search over
  every sequence of up to 3 tokens, scored with the formula above, agrees."""
  p_eos, p_eos_after_aa = np.exp(-1.0), np.exp(-1.5) / (1 - np.exp(-1.0))
  table = {(): [0, p_eos, 1 - p_eos], (2,): [0, 0.0, 1.0],
           (2, 2): [0, p_eos_after_aa, 1 - p_eos_after_aa]}
  outputs, scores = _table_search(table, max_len=3, beam_size=2, alpha=0.6)
  scored = {}
  for length in (1, 2, 3):  # Exhaustive: every body of a's, then EOS.
    for body in itertools.product((2,), repeat=length - 1):
      seq, logp = body + (EOS,), 0.0
      for j, token in enumerate(seq):
        prob = table.get(seq[:j], [0, 0, 0])[token]
        logp += np.log(prob) if prob > 0 else -np.inf
      scored[seq] = logp / _gnmt(length, 0.6)
  best = max(scored, key=scored.get)
  assert best == (EOS,) and outputs[0] == []
  np.testing.assert_allclose(scores, [scored[(EOS,)], scored[(2, 2, EOS)]], rtol=1e-5)
