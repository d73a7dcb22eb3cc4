"""Training batches as a pure function of the step (transformer_jax/data/batching.py,
buckets.py, packing.py, parallel_data.py)."""

import dataclasses

import numpy as np
import pytest

from conftest import toy_data
from transformer_jax import config as config_lib
from transformer_jax.config import TrainConfig
from transformer_jax.data import batching, buckets, parallel_data, tokenizer


@pytest.mark.parametrize("count", ["real", "padded"])
def test_token_budget_batches_cover_an_epoch_once_with_bounded_shapes(count):
  data = toy_data(50)
  cfg = TrainConfig(batch_tokens=256, seed=3, batch_tokens_count=count)
  grouped, bucket, starts, stops = batching._token_budget_epoch(data, cfg, 0)
  lengths = batching._plan(data, cfg).lengths[bucket]
  seen = np.concatenate([grouped[a:b] for a, b in zip(starts, stops)])
  assert sorted(seen.tolist()) == list(range(len(data)))
  assert set(lengths.tolist()) <= {8, 16, 24, 32}
  for length, a, b in zip(lengths, starts, stops):  # Each pair fits its batch's length.
    assert data.longer_side()[grouped[a:b]].max() <= length


def test_packed_rows_have_segments_and_positions():
  seqs = [np.array([5, 6, 1]), np.array([7, 1]), np.array([8, 9, 9, 1])]
  data = parallel_data.ParallelData(seqs, seqs)
  batch = batching.train_batch(data, 0, TrainConfig(batching="packed", batch_size=2), 8)
  tokens, segments = batch["inputs"], batch["inputs_segmentation"]
  for row in range(2):  # Every example appears once; positions restart per segment.
    for seg in set(segments[row]) - {0}:
      where = segments[row] == seg
      assert list(batch["inputs_positions"][row][where]) == list(range(where.sum()))
  real = sorted(tuple(tokens[r][segments[r] == s]) for r in range(2)
                for s in set(segments[r]) - {0})
  assert real == sorted(tuple(s) for s in seqs)
  np.testing.assert_array_equal(batch["targets_segmentation"], segments)


@pytest.mark.parametrize("mode", ["tokens", "packed", "sentences"])
def test_a_resumed_stream_sees_the_same_batches(mode):
  """Exact resume: batch k depends on (data, seed, k) only, across epochs too."""
  data = toy_data(60)
  cfg = TrainConfig(batching=mode, batch_size=8, batch_tokens=256, seed=5)
  uninterrupted = [batching.train_batch(data, k, cfg, 32, 2) for k in range(30)]
  batching.clear_caches()  # As in a fresh process.
  resumed = [batching.train_batch(data, k, cfg, 32, 2) for k in range(12, 30)]
  for a, b in zip(uninterrupted[12:], resumed):
    assert a.keys() == b.keys()
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])
  assert not np.array_equal(uninterrupted[0]["inputs"], uninterrupted[1]["inputs"])


def test_packing_fills_rows():
  """Pairs of 1 to 28 tokens (mean 15) in rows of 64: packing fills at least 80% of the
  rows with real tokens (84% measured), over three times what one pair per row does."""
  data = toy_data(2000)
  fill = lambda mode: np.mean([
      (batching.train_batch(data, k, TrainConfig(batching=mode, batch_size=64), 64)
       ["targets"] != 0).mean() for k in range(20)])
  packed, one_per_row = fill("packed"), fill("sentences")
  assert packed >= 0.8 and packed > 3 * one_per_row, (packed, one_per_row)


def test_stored_sequences_pad_truncate_and_select():
  seqs = [np.array([5, 6, 1]), np.array([7, 1]), np.array([8, 9, 9, 9, 1])]
  stored = parallel_data.Sequences.from_list(seqs)
  np.testing.assert_array_equal(stored.padded([2, -1, 0], 6),
                                parallel_data.pad([seqs[2], np.zeros(0), seqs[0]], 6))
  np.testing.assert_array_equal(stored.clipped(3)[2], [8, 9, tokenizer.EOS_ID])
  np.testing.assert_array_equal(stored.select(np.array([1]))[0], seqs[1])


def test_length_buckets_are_bounded_and_waste_the_least_padding():
  import itertools
  rng = np.random.default_rng(1)
  lengths = np.minimum(rng.lognormal(3.0, 0.6, 5000).astype(int) + 2, 256)
  chosen = buckets.length_buckets(lengths, 4)
  needed = config_lib.round_up(lengths, 8)
  assert len(chosen) == 4 and chosen[-1] == needed.max() and all(chosen % 8 == 0)
  waste = lambda b: int((b[np.searchsorted(b, needed)] - needed).sum())
  values = np.unique(needed)
  best = min(waste(np.array(sorted(c) + [values[-1]]))
             for c in itertools.combinations(values[:-1], 3))
  assert waste(chosen) == best  # Exhaustive search agrees.
  few = np.array([8, 16, 16, 24])
  np.testing.assert_array_equal(buckets.length_buckets(few, 8), [8, 16, 24])


@pytest.mark.parametrize("mode", ["tokens", "packed", "sentences"])
def test_a_batch_holds_the_same_examples_on_any_number_of_devices(mode):
  """Elastic resume: the rows the devices need (data shards x microbatches) only append
  empty rows, fewer than that multiple, after the same examples in the same order."""
  data = toy_data(60)
  cfg = TrainConfig(batching=mode, batch_size=6, batch_tokens=200, seed=5)
  for k in range(25):  # Across epochs.
    alone = batching.train_batch(data, k, cfg, 32, row_multiple=1)
    rows = len(alone["inputs"])
    for multiple in (2, 4, 8, 16):
      placed = batching.train_batch(data, k, cfg, 32, row_multiple=multiple)
      assert len(placed["inputs"]) % multiple == 0
      assert len(placed["inputs"]) - rows < multiple
      for key, value in alone.items():
        np.testing.assert_array_equal(placed[key][:rows], value)
        assert not placed[key][rows:].any()


def test_token_budget_batch_k_needs_no_earlier_epoch():
  data = toy_data(500, max_len=60)
  cfg = TrainConfig(batch_tokens=512, seed=2, max_length_buckets=3)
  batching.clear_caches()
  per_epoch = batching.steps_per_epoch(data, cfg)
  batch = batching.train_batch(data, 7 * per_epoch + 3, cfg, 64)
  assert batching._token_budget_epoch.cache_info().misses == 1  # Epoch 7 alone.
  shapes = batching.train_batch_shapes(data, cfg, 64)
  assert len(shapes) == 3 and batch["inputs"].shape in [s["inputs"] for s in shapes]


def test_a_padded_token_budget_batch_never_holds_more_positions_than_the_budget():
  """train.batch_tokens_count="padded" (fairseq's --max-tokens): rows x padded length
  stays within the budget in every bucket (a pair longer than the budget alone
  excepted), and no batch has more rows than the largest batch a fit check compiles."""
  data = toy_data(3000, max_len=60)
  for budget in (96, 250, 1000):
    cfg = TrainConfig(batching="tokens", batch_tokens=budget, batch_tokens_count="padded",
                      max_length_buckets=8, seed=3)
    shapes = _epoch_shapes(data, cfg)
    for rows, length in shapes:
      assert rows * length <= budget or rows == 1, (budget, rows, length)
      assert rows <= batching.largest_rows(cfg, length)
    assert len({length for _, length in shapes}) > 2  # Several buckets were seen.


def _epoch_shapes(data, cfg, max_length=64):
  return {batching.train_batch(data, k, cfg, max_length)["targets"].shape
          for k in range(batching.steps_per_epoch(data, cfg))}


def _wmt_like(pairs: int, seed: int = 0) -> parallel_data.ParallelData:
  """Subword lengths of a WMT-like corpus: log-normal around 26 tokens with a long tail
  (1-250), the other side within about 15% of it."""
  rng = np.random.default_rng(seed)
  src = np.clip(rng.lognormal(np.log(26), 0.6, pairs), 1, 250).astype(int)
  tgt = np.clip(src * rng.lognormal(0.03, 0.15, pairs), 1, 250).astype(int)
  return _of_lengths(src, tgt)


def _of_lengths(*sides) -> parallel_data.ParallelData:
  """Pairs of these lengths (one array a side), of non-padding ids."""
  return parallel_data.ParallelData(*[
      parallel_data.Sequences.from_flat(np.full(int(np.sum(n)), 5, np.int32), n)
      for n in sides])


@pytest.mark.parametrize("budget", [4096, 25_000])
def test_real_token_batches_hold_the_budget_in_real_tokens_a_side(budget):
  """Sec. 5.1: "approximately 25000 source tokens and 25000 target tokens" a batch, real
  tokens, not padded positions. Over an epoch of WMT-like lengths each side's mean is
  within 3% of train.batch_tokens, with static shapes (one per bucket); padding
  counted instead ("padded") leaves about a sixth of it out."""
  data = _wmt_like(budget * 16)  # About 430 batches an epoch: few partly filled.
  real = TrainConfig(batch_tokens=budget, seed=1)
  assert real.batch_tokens_count == "real"  # The paper's, by default.
  source, target = batching.real_tokens_per_batch(data, real, 256)
  assert abs(source / budget - 1) < 0.03 and abs(target / budget - 1) < 0.03, (source, target)
  counted = np.mean([(batching.train_batch(data, k, real, 256)["targets"] != 0).sum()
                     for k in range(batching.steps_per_epoch(data, real))])
  assert counted == pytest.approx(target, rel=1e-6)  # The figure is the batches' own.
  shapes = _epoch_shapes(data, real, 256)
  assert len(shapes) == len({length for _, length in shapes}) <= real.max_length_buckets
  for rows, length in shapes:  # Never more than 1.5 x the budget in positions.
    assert rows * length <= batching.MAX_PADDED_RATIO * budget
    assert rows <= batching.largest_rows(real, length)
  padded = dataclasses.replace(real, batch_tokens_count="padded")
  _, padded_target = batching.real_tokens_per_batch(data, padded, 256)
  assert 0.75 * budget < padded_target < 0.9 * budget, padded_target


def test_the_largest_batch_bounds_every_batch_of_any_data():
  """What fit checks compile (`largest_batch_shapes`: rows x data.max_length) holds at
  least the positions of every batch, however the lengths fall: real tokens may fill a
  short bucket with up to MAX_PADDED_RATIO x the budget, never more."""
  for data in (_wmt_like(5000, seed=2), toy_data(3000, max_len=60),
               _of_lengths(np.full(500, 2), np.full(500, 64))):
    for count in ("real", "padded"):
      cfg = TrainConfig(batch_tokens=2048, batch_tokens_count=count)
      rows, width = batching.largest_batch_shapes(cfg, 256)["targets"]
      assert width == 256
      for r, length in _epoch_shapes(data, cfg, 256):
        assert r * length <= rows * width, (count, r, length, rows)


def test_packed_rows_keep_each_sides_segments_and_positions_apart():
  """Sources and targets of different lengths: each side's segment s is the same pair's
  sentence, and its positions restart at that side's own sentence."""
  rng = np.random.default_rng(1)
  sources = [np.append(rng.integers(3, 20, rng.integers(1, 7)), 1) for _ in range(40)]
  targets = [np.append(rng.integers(20, 40, rng.integers(1, 12)), 1) for _ in range(40)]
  data = parallel_data.ParallelData(sources, targets)
  batch = batching.train_batch(data, 0, TrainConfig(batching="packed", batch_size=6), 24)
  pair_of = {tuple(s): i for i, s in enumerate(sources)}
  checked = 0
  for row in range(6):
    for seg in set(batch["inputs_segmentation"][row]) - {0}:
      src_at = batch["inputs_segmentation"][row] == seg
      tgt_at = batch["targets_segmentation"][row] == seg
      i = pair_of[tuple(batch["inputs"][row][src_at])]
      np.testing.assert_array_equal(batch["targets"][row][tgt_at], targets[i])
      np.testing.assert_array_equal(batch["inputs_positions"][row][src_at],
                                    np.arange(len(sources[i])))
      np.testing.assert_array_equal(batch["targets_positions"][row][tgt_at],
                                    np.arange(len(targets[i])))
      checked += len(sources[i]) != len(targets[i])
  assert checked > 5  # Pairs whose two sides differ in length.
