"""What a run costs before it starts, part by part: hours and device-hours of training,
of the held-out evaluations and BLEU decodes, of the final (averaged) test decode, of
checkpoint writes, of compilation and of data preparation. The launcher's dry run
prints it on every target (`launch --dry_run`); every number says whether it is
estimated or measured, and on what it rests.

The models, each as simple as its part allows:

- Training: a step's computed positions (a real-token batch holds train.batch_tokens
  real tokens a side on average, REAL_SHARE of what it computes) at the step's estimated
  time a position. For a TPU slice that is the TPU compiler's estimate of the longest
  batch, compiled here (`benchmark --topology`); otherwise 6 N FLOPs a position at the
  devices' datasheet peak, plus, on several GPUs, the gradients' all-reduce at NVLink's
  (one host) or the network's (several) datasheet bandwidth, not overlapped. Where a step
  of the same estimate was measured on that kind of device (`MEASURED_STEPS`), the
  estimate is multiplied by the measured-over-estimated ratio, and the batch it was
  measured with is named.
- Evaluations: train.num_eval_batches forward passes (2 N FLOPs a position) at the
  training step's rate per FLOP, at each evaluation the loop makes (`cadence`).
- Decodes: each translated sentence at the measured time a sentence of beam search
  (`DECODE_MEASURED`), times as many more beam-search steps as the run's decoding batches
  are smaller, times the parameters over those of the model measured.
- Checkpoints: parameters and Adam's two moments (float32) written at a stated
  bandwidth; a save runs in the background, and training waits for the last (which
  also holds the average's running sum) and, with train.defer_checkpoints=False, where
  one outlasts the steps until the next save (which waits for it).
- Compilation and data preparation: measured figures, named.
"""

from __future__ import annotations

import dataclasses
import math

import jax

from transformer_jax import config as config_lib
from transformer_jax.data import corpora
from transformer_jax.model.transformer import Transformer, init_params
from transformer_jax.planning import topology
from transformer_jax.training import cadence

# Real target tokens over computed positions of a real-token batch: 24,798 real target
# tokens a batch, 15.3% padding, over an epoch of WMT14-sized pairs
# (`benchmarks.input_pipeline --restart_only`, 2026-12-05; docs/results.md).
REAL_SHARE = 1 - 0.153
REAL_SHARE_SOURCE = "measured 2026-12-05, benchmarks.input_pipeline"

# Per GPU, each way, GB/s (datasheets): NVLink within a host (H100 and H200 SXM: 900
# GB/s both ways), and one 400 Gb/s network adapter a GPU between hosts (DGX H100/H200).
NVLINK_GBPS = 450.0
NETWORK_GBPS = 50.0


@dataclasses.dataclass(frozen=True)
class StepMeasured:
  """A train step measured on one device, as the FLOP estimate's correction."""

  step_s: float  # The median step.
  positions: int  # Computed target positions a step (real tokens / real share).
  params: int  # Of the model measured.
  what: str  # Which model, where and when.

  def ratio(self, peak_tflops: float) -> float:
    """Measured over estimated (6 N FLOPs a position at the datasheet peak)."""
    return self.step_s / (self.positions * 6 * self.params / (peak_tflops * 1e12))


# docs/results.md, "Base and big on one GPU": base in bfloat16 with cuDNN's attention,
# rbg dropout and model.vocab_multiple=128 (63,107,072 parameters); positions = non-pad
# target tokens/s x median step / 84.0% real.
MEASURED_STEPS = {
    "NVIDIA H200": StepMeasured(0.0494, round(418_048 * 0.0494 / 0.840), 63_107_072,
                                "one H200 (base, 49.4 ms a step, 2026-11-28)"),
    "NVIDIA H100 80GB HBM3": StepMeasured(0.0534, round(379_109 * 0.0534 / 0.840),
                                          63_107_072,
                                          "one H100 (base, 53.4 ms a step, 2026-11-26)"),
}
MEASURED_BATCH = ("the padded batch (train.batch_tokens_count=padded: a quarter fewer real "
                  "tokens a step than a real-token batch)")

# The GPU suite's decode job (docs/results.md, "Decoding"): beam 4 on newstest2014's
# 3,003 sources, base's random weights, every output to its length limit (a trained
# model stops earlier), batches of 16,384 source tokens.
DECODE_MEASURED = {"sentences_per_s": 962.7, "batch_tokens": 16_384, "params": 63_107_072,
                   "what": "measured on one H200 (2026-11-26: base, beam 4, 962.7 "
                           "sentences/s, every output to its length limit)"}

# Compiling a run's train steps (8 length buckets) and eval step, per device kind: the
# GPU suite's base job (docs/scaling.md, "A GPU session: one call").
COMPILE_MEASURED = {
    "NVIDIA H200": (79.0, "measured on one H200 (2026-11-26): base's train and eval "
                          "programs, once (a restart reads the compilation cache)"),
    "NVIDIA H100 80GB HBM3": (134.0, "measured on a fresh H100 (2026-11-26): base's train "
                                     "and eval programs, once (a restart reads the "
                                     "compilation cache)"),
}
COMPILE_ELSEWHERE = (134.0, "estimated: not measured on this kind of device; as on a fresh "
                            "H100 (measured 2026-11-26)")

# The tokenizer trained and the training split tokenized into its cache, WMT14's size
# (`benchmarks.input_pipeline`, 4.5M pairs, a 2-core CPU, 2026-11-24: first start).
DATA_MEASURED = (176.0, "measured 2026-11-24, benchmarks.input_pipeline's first start: "
                        "the tokenizer and token cache of 4.5M pairs on 2 CPU cores; "
                        "TFDS's download and build of the corpus not included")

# Sentences of held-out and test splits this module knows, by (TFDS name, split).
SPLIT_SENTENCES = {
    ("wmt14_translate/de-en", "validation"): (3000, "newstest2013"),
    ("wmt14_translate/de-en", "test"): (3003, "newstest2014"),
    ("wmt14_translate/fr-en", "validation"): (3000, "newstest2013"),
    ("wmt14_translate/fr-en", "test"): (3003, "newstest2014"),
}


@dataclasses.dataclass(frozen=True)
class Part:
  name: str
  seconds: float | None  # None: not estimated (`basis` says why).
  basis: str  # Begins with "estimated" or "measured" (where and when).


def parameter_count(cfg: config_lib.Config) -> int:
  """The model's parameters (the vocabulary as data.vocab_size asks), from shapes alone."""
  if not cfg.model.vocab_size:
    cfg = config_lib.with_vocab(cfg, cfg.data.vocab_size)
  shapes = jax.eval_shape(lambda rng: init_params(Transformer(cfg.model), rng),
                          jax.random.key(0))
  return sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))


def step_positions(train: config_lib.TrainConfig, max_length: int) -> tuple[float, str]:
  """Computed target positions of an average train step, and how they are counted."""
  if train.batching != "tokens":
    return train.batch_size * max_length, f"{train.batch_size} rows of {max_length}"
  if train.batch_tokens_count == "padded":
    return train.batch_tokens, "a padded batch's, at most"
  return (train.batch_tokens / REAL_SHARE,
          f"{train.batch_tokens:,} real tokens of a real-token batch / {REAL_SHARE:.3f}, the "
          f"real share {REAL_SHARE_SOURCE}")


@dataclasses.dataclass(frozen=True)
class StepRate:
  """A train step's estimated seconds a position, and what the estimate rests on."""

  seconds_per_position: float
  basis: str
  fixed_s: float = 0.0  # Per step, whatever the batch: the all-reduce.


def step_rate(target: topology.Tpu | topology.Gpus, params: int, compiled: dict | None
              ) -> StepRate:
  """From `compiled` (benchmark --topology's figures of the longest batch) where given,
  else from 6 N FLOPs a position at the peak (and the all-reduce), corrected by a
  measured ratio where `MEASURED_STEPS` has the kind."""
  if compiled and compiled.get("estimated_step_s"):
    rows, width = compiled["batch"]
    return StepRate(compiled["estimated_step_s"] / (rows * width),
                    f"the {compiled['estimate']}'s estimate a position of the longest "
                    f"batch ({rows} x {width}, {compiled['estimated_step_s'] * 1e3:.1f} ms) "
                    f"compiled here for {target.accelerator_type}; no step measured on "
                    f"{target.device_kind}, so a lower bound")
  flops = 6 * params / (target.chips * target.peak_tflops * 1e12)
  basis = (f"6 x {params / 1e6:.1f}M FLOPs at {target.chips} x "
           f"{target.peak_tflops:.0f} TFLOP/s (datasheet)")
  measured = MEASURED_STEPS.get(target.device_kind)
  if measured:
    ratio = measured.ratio(target.peak_tflops)
    flops *= ratio
    basis += (f" x {ratio:.2f}, measured over this estimate on {measured.what} with "
              f"{MEASURED_BATCH}" + (f"; there one GPU's whole batch, here split {target.chips}"
                                     " ways, so a lower bound" if target.chips > 1 else ""))
  else:
    basis += f"; no step measured on {target.device_kind}, so a lower bound"
  fixed = 0.0
  if isinstance(target, topology.Gpus) and target.chips > 1:
    gbps = NVLINK_GBPS if target.hosts == 1 else NETWORK_GBPS
    fixed = 2 * (target.chips - 1) / target.chips * 4 * params / (gbps * 1e9)
    basis += (f"; + {fixed * 1e3:.2f} ms all-reduce of float32 gradients at {gbps:.0f} "
              f"GB/s ({'NVLink' if target.hosts == 1 else 'network'}, datasheet), not "
              "overlapped")
  return StepRate(flops, basis, fixed)


def cadence_counts(train: config_lib.TrainConfig) -> dict[str, int]:
  """How many held-out losses, BLEU decodes and checkpoints the loop makes over
  train.num_train_steps steps (the loop's own cadence; not counting a checkpoint that
  train.keep_best_by or a signal adds)."""
  last, steps = train.num_train_steps, range(1, train.num_train_steps + 1)
  return {"evals": sum(cadence.due(s, train.eval_every_steps, last) for s in steps),
          "bleus": sum(cadence.bleu_due(s, train.bleu_every_steps, last, train.average_last)
                       for s in steps),
          "saves": sum(cadence.due(s, train.checkpoint_every_steps, last) for s in steps)}


def split_sentences(data: config_lib.DataConfig, split: str) -> tuple[int, str] | None:
  """(sentences, name) of a held-out or test split this module knows, else None."""
  name = data.eval_split if split == "eval" else data.test_split
  dataset = corpora.named(data).split(":")[0]  # Any version of a builder: the same splits.
  return SPLIT_SENTENCES.get((dataset, name))


def decode_seconds_a_sentence(cfg: config_lib.Config, params: int) -> tuple[float, str]:
  """Beam search's seconds a sentence: the measured rate, times as many more steps as
  the run's decoding batches are smaller, times the parameters over those measured."""
  m = DECODE_MEASURED
  smaller = max(1.0, m["batch_tokens"] / cfg.decode.batch_tokens
                if cfg.decode.batch_tokens else 1.0)
  larger = params / m["params"]
  beams = cfg.decode.beam_size / 4
  seconds = smaller * larger * beams / m["sentences_per_s"]
  return (seconds,
          f"{seconds * 1e3:.2f} ms a sentence: {1e3 / m['sentences_per_s']:.2f} ms "
          f"{m['what']} x {smaller:.0f} (the run's batches of {cfg.decode.batch_tokens:,} "
          f"source tokens, not {m['batch_tokens']:,}: as many more beam-search steps) x "
          f"{larger:.2f} (parameters over base's)"
          + (f" x {beams:.2f} (beams over 4)" if beams != 1 else ""))


def _decodes(cfg: config_lib.Config, params: int, splits: list[tuple[str, int]]
             ) -> tuple[float | None, str]:
  """Seconds of translating each (split, times), and the basis; None for a split of
  unknown size."""
  per_sentence, basis = decode_seconds_a_sentence(cfg, params)
  seconds, named = 0.0, []
  for split, times in splits:
    known = split_sentences(cfg.data, split)
    if known is None:
      return None, (f"not estimated: the size of the {split} split of {cfg.data.task} "
                    "data is known only once it is loaded")
    seconds += times * known[0] * per_sentence
    named.append(f"{times} x {known[1]} ({known[0]:,} sentences)")
  return seconds, f"{' + '.join(named)}, {basis}"


def checkpoint_part(cfg: config_lib.Config, params: int, step_s: float, saves: int,
                    mb_per_s: float) -> Part:
  """Training's wait on checkpoint writes at `mb_per_s`: each save in the background;
  a save due while the previous is written is deferred (train.defer_checkpoints,
  training/saving.py), else it waits for it; the last waited for before the final
  evaluation, with the averaging window's running sum (training/averaging.py)."""
  size = 12 * params  # Parameters and Adam's two moments, float32.
  last_size = size + 4 * params * (cfg.train.average_last > 1)
  save_s = size / (mb_per_s * 1e6)
  interval_s = cfg.train.checkpoint_every_steps * step_s
  outlasting = 0.0 if cfg.train.defer_checkpoints else max(0.0, save_s - interval_s)
  wait = (saves - 1) * outlasting + last_size / (mb_per_s * 1e6)
  return Part("checkpoint writes", wait,
              f"estimated: {saves:,} saves of {size / 1e9:.2f} GB (parameters and Adam's "
              f"moments, float32) at {mb_per_s:g} MB/s (--checkpoint_mb_per_s), "
              f"{save_s:.1f} s each, in the background of the "
              f"{cfg.train.checkpoint_every_steps:,} steps to the next ({interval_s:.1f} s): "
              + ("training waits for the last (with the average's running sum, "
                 f"{last_size / 1e9:.2f} GB); one due while another is written is deferred"
                 if cfg.train.defer_checkpoints else
                 "training waits for the last, and for any that outlasts them"))


def parts(cfg: config_lib.Config, target: topology.Tpu | topology.Gpus, params: int,
          compiled: dict | None = None, mb_per_s: float = 200.0) -> list[Part]:
  """The run's cost on `target`, part by part (module docstring)."""
  rate = step_rate(target, params, compiled)
  positions, counted = step_positions(cfg.train, cfg.data.max_length)
  step_s = positions * rate.seconds_per_position + rate.fixed_s
  steps, counts = cfg.train.num_train_steps, cadence_counts(cfg.train)
  eval_positions = cfg.train.num_eval_batches * cfg.train.batch_size * cfg.data.max_length
  losses = counts["evals"] * eval_positions * rate.seconds_per_position / 3
  bleus, bleu_basis = _decodes(cfg, params, [("eval", counts["bleus"])])
  final, final_basis = _decodes(cfg, params, [("eval", 1)] + [("test", 1)] *
                                cfg.train.final_test)
  return [
      Part("training", steps * step_s,
           f"estimated: {steps:,} steps x {step_s * 1e3:.2f} ms; a step: {positions:,.0f} "
           f"positions ({counted}) x {rate.basis}"),
      Part("held-out losses", losses,
           f"estimated: {counts['evals']} x {cfg.train.num_eval_batches} batches of "
           f"{cfg.train.batch_size} x {cfg.data.max_length}, forward only (a third of a "
           "train step's FLOPs a position)"),
      Part("mid-run BLEU decodes", bleus, "estimated: " + bleu_basis if bleus is not None
           else bleu_basis),
      Part("final averaged decodes", final, "estimated: " + final_basis
           if final is not None else final_basis),
      checkpoint_part(cfg, params, step_s, counts["saves"], mb_per_s),
      Part("compilation", *COMPILE_MEASURED.get(target.device_kind, COMPILE_ELSEWHERE)),
      Part("data preparation", *DATA_MEASURED),
  ]


def describe(name: str, target: topology.Tpu | topology.Gpus, run_parts: list[Part]
             ) -> list[str]:
  """The printed lines: the whole, then each part with its hours, device-hours and
  basis."""
  unit = "GPU-hours" if isinstance(target, topology.Gpus) else "chip-hours"
  known = [p.seconds for p in run_parts if p.seconds is not None]
  hours = sum(known) / 3600
  lines = [f"# {name}: cost on {target.accelerator_type} ({target.chips} "
           f"{'GPUs' if unit == 'GPU-hours' else 'chips'}, {target.hosts} host(s)): "
           f"{hours:,.2f} h, {hours * target.chips:,.1f} {unit} in all"
           + (", parts not estimated left out" if len(known) < len(run_parts) else "")]
  for p in run_parts:
    figure = ("?" if p.seconds is None else
              f"{p.seconds / 3600:,.3f} h, {p.seconds * target.chips / 3600:,.2f} {unit}")
    lines.append(f"#   {p.name}: {figure}; {p.basis}")
  return lines
