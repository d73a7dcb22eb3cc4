"""The config's five sections, typed and frozen: the model, the optimizer, decoding,
training and the data. Each field's default is the paper's base model on WMT14 EN-DE
where the paper says, with what it means (docs/config.md) and whether a resume may
change it."""

from __future__ import annotations

import dataclasses
from typing import Any

from transformer_jax.config.fields import (ACTIVATIONS, BATCHING,
                                           DEFAULT_LOGICAL_AXIS_RULES, DTYPES, field,
                                           KEEP_BEST_BY, KERNEL_CHOICES,
                                           MESH_AXES, PAPER_ROWS, PRETOKENIZERS,
                                           RNG_IMPLS, round_up, TOKEN_COUNTS,
                                           TOKENIZER_TYPES,
                                           check as _check, check_rate as _check_rate)
from transformer_jax.registry import Registry

# data.task's values: each a module of transformer_jax/data/datasets/ that registers its
# Corpus here under its own name (docs/extending.md), imported when a config names it.
DATASETS = Registry("dataset", "transformer_jax.data.datasets")
# model.attention_implementation's values (besides "" and "auto"): each a module of
# transformer_jax/model/attention_implementations/ that registers its Implementation here
# under its own name (docs/extending.md); model/attention.py dispatches to it.
ATTENTION = Registry("attention implementation",
                     "transformer_jax.model.attention_implementations")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Transformer sizes and options (paper defaults: base model, Table 3).

  `vocab_size` is not a config field: the run fills it in from its tokenizer
  (`data.vocab_size` is the size asked of SentencePiece).
  """

  vocab_size: int = 0
  d_model: int = field(512, "Model width d_model (Sec. 3, Table 3).")
  num_heads: int = field(8, "Attention heads h (Sec. 3.2.2).")
  num_encoder_layers: int = field(6, "N (Sec. 3.1).")
  num_decoder_layers: int = field(6, "N (Sec. 3.1).")
  d_ff: int = field(2048, "Inner width of the feed-forward sublayers (Sec. 3.3).")
  dropout_rate: float = field(0.1,
      "P_drop: sub-layer outputs and embedding sums (Sec. 5.4).")
  attention_dropout_rate: float = field(0.0, "Not in the paper; an option.")
  relu_dropout_rate: float = field(0.0, "Not in the paper; an option.")
  pre_norm: bool = field(False, "Paper: post-norm LayerNorm(x + Sublayer(x)) (Sec. 3.1).")
  share_embeddings: bool = field(True,
      "Sec. 3.4: one matrix for both embeddings and softmax.")
  learned_positions: bool = field(False, "Sec. 3.5 uses sinusoids; Table 3 (E) learned.")
  qkv_init_scale: float = field(1.0,
      "The query, key and value projections start Glorot-uniform (the paper names no "
      "initialization) with this times the variance; fairseq's Transformer uses 0.5 (a "
      "gain of 1/sqrt(2), \"convergence much better\"), for porting its recipes. With "
      "dropout 0.3 on Multi30k, 1.0 left the cross-attention uniform (docs/results.md).")
  key_dim: int = field(0,
      "d_k per head; 0: d_model / num_heads as in the paper (Table 3 B).")
  max_len: int = field(512, "Longest position the encodings cover.")
  dtype: str = field("float32", "Compute dtype; parameters stay float32.")
  attention_implementation: str = field("",
      'What computes the attention, a module of model/attention_implementations/ by name '
      '(docs/extending.md adds one): "" or "xla" = XLA; an option, a GPU fast path: '
      '"cudnn" = the fused cuDNN attention kernel (GPU, bfloat16; padding and causal masks '
      'as sequence lengths, packed rows through XLA); "auto" = cuDNN on a GPU in bfloat16 '
      'where its limits allow, else XLA.')
  norm_kernel: str = field("xla",
      'The residual connections, LayerNorm(x + Dropout(sublayer(x))) (Sec. 3.1, 5.4): '
      '"xla" (XLA\'s fusions, nn.Dropout\'s masks) or, an option for GPUs, "pallas" '
      "(this project's kernel, kernels/residual_norm.py: one read and one write each way, "
      "the dropout bits computed inside it; other masks, the same keep probability; "
      "post-norm only; interpreted on a CPU).", resumable=True)
  ffn_kernel: str = field("xla",
      'The feed-forward layers\' ReLU and second product (Sec. 3.3): "xla" (XLA\'s) or, an '
      'option for GPUs, "pallas" (kernels/ffn.py: the gradient through the '
      "product and the ReLU in one kernel, never writing the [tokens, d_ff] gradient "
      "before the ReLU's; ReLU only, without model.relu_dropout_rate; interpreted on a "
      "CPU).", resumable=True)
  vocab_multiple: int = field(1,
      "Option: the embedding matrix padded to a multiple of this many rows (128 suits GPU "
      "and TPU matrix units); padded ids are sliced off the logits, never predicted.")
  scan_layers: bool = field(False,
      'Option: each stack as one nn.scan over its layers (parameters stacked on a leading '
      '"layers" axis): compile time stays flat with depth; same numbers as unrolled.')
  scan_unroll: int = field(1,
      "Option, with model.scan_layers: layers per trip of the scanned loop. The stack's "
      "depth makes one straight-line program that keeps the parameters stacked: each "
      "Adam update and gradient-norm kernel covers every layer at once (base's step "
      "compiled for an H100: 931 kernels, not 1,334; docs/results.md); it compiles as "
      "long as unrolled layers do.")
  # Options that a model imported from Hugging Face (OPUS-MT's MarianMT) needs
  # (inference/huggingface.py); the paper's values are the defaults.
  activation: str = field("relu",
      'The feed-forward activation: "relu" as Sec. 3.3; options "swish" (x sigmoid(x), '
      'OPUS-MT\'s) and "gelu" (exact, with erf).')
  attention_bias: bool = field(False,
      "Option: biases on the query, key, value and output projections (OPUS-MT's); the "
      "paper's projections have none (Sec. 3.2.2).")
  logits_bias: bool = field(False,
      "Option: a bias on the output logits (MarianMT's final_logits_bias); the paper has "
      "none (Sec. 3.4).")
  layer_norm_epsilon: float = field(1e-6,
      "LayerNorm's epsilon: 1e-6 as tensor2tensor, the paper's code; Hugging Face's "
      "MarianMT uses 1e-5 (set by import_model).")

  @property
  def padded_vocab_size(self) -> int:
    return round_up(self.vocab_size, self.vocab_multiple)

  def __post_init__(self):
    _check(self.attention_implementation in ("", "auto", *ATTENTION.names()),
           "model.attention_implementation", self.attention_implementation,
           f"one of {', '.join(map(repr, ATTENTION.names()))} (a module of "
           "model/attention_implementations/), 'auto' or '' (XLA)")
    _check(self.vocab_multiple >= 1, "model.vocab_multiple", self.vocab_multiple, ">= 1")
    choices = KERNEL_CHOICES["model.norm_kernel"]
    _check(self.norm_kernel in choices and not (self.norm_kernel == "pallas" and
                                                self.pre_norm),
           "model.norm_kernel", self.norm_kernel, f"one of {choices}, and 'xla' with "
           "model.pre_norm=True (the kernel fuses the post-norm residual)")
    choices = KERNEL_CHOICES["model.ffn_kernel"]
    _check(self.ffn_kernel in choices and not (self.ffn_kernel == "pallas" and (
        self.activation != "relu" or self.relu_dropout_rate)), "model.ffn_kernel",
           self.ffn_kernel, f"one of {choices}, and 'xla' with model.activation other than "
           "'relu' or a model.relu_dropout_rate (the kernel fuses ReLU's gradient alone)")
    _check(self.vocab_size >= 0, "model.vocab_size", self.vocab_size,
           ">= 0 (0: not yet known, taken from the tokenizer)")
    for name in ("d_model", "num_heads", "d_ff", "max_len", "qkv_init_scale"):
      _check(getattr(self, name) > 0, f"model.{name}", getattr(self, name), "> 0")
    for name in ("num_encoder_layers", "num_decoder_layers"):
      _check(getattr(self, name) >= 1, f"model.{name}", getattr(self, name), ">= 1")
    _check(
        self.d_model % self.num_heads == 0, "model.d_model", self.d_model,
        f"a multiple of model.num_heads={self.num_heads} (d_k = d_model / h)")
    for name in ("dropout_rate", "attention_dropout_rate", "relu_dropout_rate"):
      _check_rate("model", name, getattr(self, name))
    _check(self.key_dim >= 0, "model.key_dim", self.key_dim, ">= 0 (0: d_model / h)")
    _check(self.dtype in DTYPES, "model.dtype", self.dtype, f"one of {DTYPES}")
    _check(self.activation in ACTIVATIONS, "model.activation", self.activation,
           f"one of {ACTIVATIONS}")
    _check(self.layer_norm_epsilon > 0, "model.layer_norm_epsilon",
           self.layer_norm_epsilon, "> 0")
    _check(self.scan_unroll >= 1, "model.scan_unroll", self.scan_unroll,
           ">= 1 (layers per trip of model.scan_layers' loop)")

  @property
  def head_dim(self) -> int:
    """d_v, the size of each head's values (and of its keys unless key_dim is set)."""
    return self.d_model // self.num_heads

  @property
  def qk_dim(self) -> int:
    return self.key_dim or self.head_dim


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """Adam with the inverse-square-root schedule of Sec. 5.3."""

  schedule: str = field("paper",
      '"paper": lrate = d_model^-0.5 min(step^-0.5, step warmup_steps^-1.5) (Sec. 5.3), '
      'times learning_rate_multiplier; "fairseq": fairseq\'s inverse_sqrt, for porting '
      "its recipes: linear from warmup_init_lr to peak_learning_rate over warmup_steps "
      "updates, then peak_learning_rate sqrt(warmup_steps / updates).", resumable=True)
  learning_rate_multiplier: float = field(1.0,
      "Scales the paper's lrate formula.", resumable=True)
  peak_learning_rate: float = field(5e-4,
      'schedule="fairseq": the learning rate at the end of warmup (fairseq\'s --lr).',
      resumable=True)
  warmup_init_lr: float = field(1e-7,
      'schedule="fairseq": the first update\'s learning rate (fairseq\'s '
      "--warmup-init-lr).", resumable=True)
  warmup_steps: int = field(4000,
      "warmup_steps of the lrate formula (Sec. 5.3).", resumable=True)
  beta1: float = field(0.9, "Adam beta_1 (Sec. 5.3).", resumable=True)
  beta2: float = field(0.98, "Adam beta_2 (Sec. 5.3).", resumable=True)
  epsilon: float = field(1e-9, "Adam epsilon (Sec. 5.3).", resumable=True)
  grad_clip_norm: float = field(0.0,
      "0 disables clipping (the paper does not clip); a resume may change it, not turn it "
      "on or off (that changes the optimizer state).", resumable=True)

  def __post_init__(self):
    _check(self.schedule in ("paper", "fairseq"), "optimizer.schedule", self.schedule,
           "'paper' or 'fairseq'")
    for name in ("learning_rate_multiplier", "peak_learning_rate"):
      _check(getattr(self, name) > 0, f"optimizer.{name}", getattr(self, name), "> 0")
    _check(0 <= self.warmup_init_lr <= self.peak_learning_rate, "optimizer.warmup_init_lr",
           self.warmup_init_lr, "in [0, optimizer.peak_learning_rate]")
    _check(self.warmup_steps >= 1, "optimizer.warmup_steps", self.warmup_steps, ">= 1")
    for name in ("beta1", "beta2"):
      _check(0.0 <= getattr(self, name) < 1.0, f"optimizer.{name}", getattr(self, name),
             "a value in [0, 1)")
    _check(self.epsilon > 0, "optimizer.epsilon", self.epsilon, "> 0")
    _check(self.grad_clip_norm >= 0, "optimizer.grad_clip_norm", self.grad_clip_norm,
           ">= 0 (0 disables clipping)")


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
  """Beam search as in Sec. 6.1: beam 4, alpha 0.6, max length = input + 50."""

  beam_size: int = field(4, "Beams per sentence (Sec. 6.1).", resumable=True)
  length_penalty: float = field(0.6,
      "alpha of the length penalty lp(Y) that scores divide by (length_penalty_form).",
      resumable=True)
  length_penalty_form: str = field("gnmt",
      '"gnmt": the paper\'s lp(Y) = ((5 + |Y|) / 6)^alpha; "fairseq": |Y|^alpha (|Y| '
      "with the EOS), fairseq generate's --lenpen, for porting its recipes.",
      resumable=True)
  finish_within_beam: bool = field(False,
      "Option: a hypothesis finishes only with an EOS among a step's best beam_size "
      "candidates, as fairseq, CTranslate2 and Hugging Face's transformers search; "
      "False: among all 2 x beam_size it ranks, as tensor2tensor (the paper's code).",
      resumable=True)
  max_extra_length: int = field(50,
      "Output may be at most this much longer than input.", resumable=True)
  batch_tokens: int = field(2048,
      "Decoding batches: as many sentences as fit batch_tokens source tokens (rows x "
      "width), at most batch_size; batch_tokens 0: batch_size sentences. 2,048 tokens is "
      "about 64 newstest2014 sentences, the fastest on a 2-core CPU; GPUs want more.",
      resumable=True)
  batch_size: int = field(256,
      "At most this many sentences per decoding batch.", resumable=True)
  sample: str = field("",
      'Option, for back-translation: sample one token at a time instead of beam search, '
      '"topk:K", "topp:P" (nucleus) or "temperature:T"; "": beam search.', resumable=True)
  seed: int = field(0,
      "Of sampling: the same seed and input give the same samples.", resumable=True)

  def describe(self) -> str:
    """How it decodes, in words, for logs: "beam 4, length penalty 0.6" or "sampling
    topp:0.9, seed 1"."""
    if self.sample:
      return f"sampling {self.sample}, seed {self.seed}"
    form = "" if self.length_penalty_form == "gnmt" else f" ({self.length_penalty_form})"
    return f"beam {self.beam_size}, length penalty {self.length_penalty}{form}"

  def __post_init__(self):
    kind, _, value = self.sample.partition(":")
    number = float(value) if value.replace(".", "", 1).isdigit() else 0.0
    _check(not self.sample or number > 0 and (kind == "temperature" or kind == "topp" and
           number <= 1 or kind == "topk" and number == int(number)), "decode.sample",
           self.sample, "'', 'topk:K' (K >= 1), 'topp:P' (0 < P <= 1) or 'temperature:T'")
    _check(self.beam_size >= 1, "decode.beam_size", self.beam_size, ">= 1")
    _check(self.length_penalty >= 0, "decode.length_penalty", self.length_penalty, ">= 0")
    _check(self.length_penalty_form in ("gnmt", "fairseq"), "decode.length_penalty_form",
           self.length_penalty_form, "'gnmt' or 'fairseq'")
    _check(self.max_extra_length >= 1, "decode.max_extra_length", self.max_extra_length,
           ">= 1")
    _check(self.batch_size >= 1, "decode.batch_size", self.batch_size, ">= 1")
    _check(self.batch_tokens >= 0, "decode.batch_tokens", self.batch_tokens, ">= 0")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """The training loop: steps, batch, loss and the cadence of side work."""

  num_train_steps: int = field(100_000,
      "Base: 100k steps (Sec. 5.2); big: 300k.", resumable=True)
  batching: str = field("tokens",
      '"tokens": pairs of similar length, about batch_tokens a side a step (Sec. 5.1); '
      '"packed": batch_size rows of data.max_length, several pairs per row (static shapes, '
      'for TPUs); "sentences": batch_size pairs padded to data.max_length.')
  batch_tokens: int = field(25_000, "All devices together; what it counts is "
      "batch_tokens_count.")
  batch_tokens_count: str = field("real",
      '"real": each length bucket holds as many rows as make batch_tokens real tokens a '
      "side on average, the mean of source and target (Sec. 5.1: about 25,000 source and "
      "25,000 target tokens), up to 1.5 x batch_tokens positions with padding; "
      '"padded": rows x padded length <= batch_tokens (fairseq\'s --max-tokens, '
      "tensor2tensor's batch_size).")
  max_length_buckets: int = field(8,
      '"tokens": pairs are padded to the nearest of at most this many lengths (multiples '
      'of 8, chosen to waste the least padding): one compiled train step per length.')
  prefetch: int = field(2,
      "Batches built and sent to the devices ahead, in a thread; 0: none.", resumable=True)
  batch_size: int = field(64, 'Rows per step for "packed" and "sentences".')
  label_smoothing: float = field(0.1, "epsilon_ls, Sec. 5.4.")
  seed: int = field(0, "Initialisation, dropout and the data order.")
  log_every_steps: int = field(100,
      "Train metrics and progress, every this many steps.", resumable=True)
  eval_every_steps: int = field(1500,
      "Held-out loss, every this many steps.", resumable=True)
  bleu_every_steps: int = field(15_000,
      "0: BLEU only at the end of training.", resumable=True)
  checkpoint_every_steps: int = field(1500,
      "The paper: every 10 minutes (base: 0.4 s/step).", resumable=True)
  eval_every_epochs: int = field(0,
      'Option, for porting fairseq recipes (its --validate-interval): the held-out loss '
      'at the end of every this many epochs (passes over the training pairs), instead of '
      'every eval_every_steps; early_stop_patience then counts epochs. Needs batching '
      '"tokens" (a fixed number of steps an epoch); 0: steps.', resumable=True)
  checkpoint_every_epochs: int = field(0,
      "Option (fairseq's --save-interval): a checkpoint at the end of every this many "
      "epochs, instead of every checkpoint_every_steps; 0: steps.", resumable=True)
  defer_checkpoints: bool = field(True,
      "A checkpoint due while the previous one is still being written is written at the "
      "first step after, instead of the step waiting (a store slower than the cadence "
      "then keeps fewer, later checkpoints; the final average is not affected: "
      "docs/reliability.md). False: each waits, so every checkpoint is of its step.",
      resumable=True)
  keep_checkpoints: int = field(5,
      "The paper averages the last 5 (base, Sec. 6.1).", resumable=True)
  average_last: int = field(5,
      "The final evaluation (results.json, the printed score) translates with the mean "
      "of the parameters of the last this many checkpoints' steps (checkpoint_every_steps "
      "apart, ending at the last step), as the paper's base (5) and big (20) models (Sec. "
      "6.1); 1: the last step's alone. Summed on the devices as the run reaches them, so "
      "keep_checkpoints does not limit it; a run that stops early averages those on disk.",
      resumable=True)
  num_eval_batches: int = field(20,
      "Held-out batches averaged for the eval loss.", resumable=True)
  final_test: bool = field(True,
      "The final evaluation also translates the data's test split, when it has one "
      "(WMT14: newstest2014), with the same (averaged) parameters, beam and alpha: the "
      "paper-style BLEU and sacreBLEU go into results.json and the run's last line. "
      "Nothing is chosen on it. False: the held-out split only.", resumable=True)
  paper_row: str = field("",
      'The row of the paper\'s Table 2 this config reproduces ("base" or "big"; the '
      "column is data.source_lang-target_lang): where the test set is the paper's "
      "(newstest2014; the dataset's paper_figure), the final test line shows the paper's "
      'BLEU beside the run\'s. configs/transformer.py sets it; "": none.', resumable=True)
  keep_best_by: str = field("",
      'Option: also keep the checkpoint with the best value of this metric (saved with '
      'it): eval/loss, eval/nll (lowest), eval/accuracy, eval/bleu, eval/bleu_lc, '
      'eval/chrf, eval/paper_bleu, eval/paper_bleu_2018, eval/lowercase_bleu (highest; the '
      'BLEUs need bleu_every_steps); "": no.', resumable=True)
  early_stop_patience: int = field(0,
      "Option: stop after this many evaluations of keep_best_by without improvement; 0: "
      "never.", resumable=True)
  num_samples: int = field(5,
      "Translations printed after the final evaluation.", resumable=True)
  mesh_shape: tuple[int, ...] = field((-1, 1, 1),
      "(data, fsdp, tensor); -1: the rest.", resumable=True)
  logical_axis_rules: tuple[tuple[str, Any], ...] = field(DEFAULT_LOGICAL_AXIS_RULES,
      "Logical axis name -> mesh axis (or None: replicated); see partitioning.py.",
      resumable=True)
  grad_accum_steps: int = field(1,
      "Microbatches per update; the update equals one big batch.", resumable=True)
  loss_chunk_length: int = field(0,
      "Option, for memory: the output projection and the loss computed this many target "
      "positions at a time (rematerialised in the backward pass), so that no [tokens, "
      "vocab] logits array exists; 0 = all at once. Same numbers either way.",
      resumable=True)
  loss_kernel: str = field("xla",
      'The output projection and its loss: "xla" (XLA\'s fusions: the [tokens, vocab] '
      'logits are written, then read) or, an option for GPUs and TPUs, "pallas" (this '
      "project's fused kernels, kernels/vocabulary_loss.py and vocabulary_loss_tpu.py: the "
      "logits never leave the chip, products recomputed in the backward pass; interpreted "
      'on a CPU) or, for GPUs, "hybrid" (the same forward kernel; the backward writes the '
      "logits' gradient once, in one kernel, and leaves its two products to cuBLAS: four "
      "products where \"pallas\" computes five and XLA three, the logits never written). "
      "Same numbers to rounding.",
      resumable=True)
  rng_impl: str = field("threefry",
      "Random bits for dropout: \"threefry\" (JAX's default) or, an option for speed on "
      "GPUs and TPUs, \"rbg\" / \"unsafe_rbg\" (the hardware generator's XLA op). Resume "
      "stays exact on the same devices; the bits depend on the implementation and on the "
      "mesh.")
  dot_merger: bool = field(True,
      "XLA's GPU compiler merges matrix products that share an operand (each attention's "
      "query, key and value projections) into one; beside cuDNN's attention each result "
      "is then copied back out of it, and the gradients copied in. False: each product "
      "alone (xla_gpu_dot_merger_threshold_mb=0), an option for speed (base's step "
      "predicted 1.2 ms shorter on an H100; docs/results.md). Same numbers.",
      resumable=True)
  perturb_init_ulps: int = field(0,
      "A control for comparing runs: every initial parameter moved this many float32 "
      "ulps up, which changes rounding and nothing of the mathematics. How far training "
      "carries that difference is the yardstick for two computations of one run (other "
      "devices, processes, microbatches, kernels); 0: none.")
  on_nonfinite: str = field("skip",
      'A step whose loss or gradient is not finite never changes the parameters. "skip": '
      'count it and go on, stopping after max_nonfinite_in_row in a row; "stop": stop at '
      'once (the last checkpoint is the last good state).', resumable=True)
  max_nonfinite_in_row: int = field(10,
      'With "skip": stop after this many in a row.', resumable=True)
  inject_nonfinite_at: tuple[int, ...] = field((),
      "Fault injection (tests): NaN loss at steps.", resumable=True)
  stall_timeout_s: float = field(1800.0,
      "A step, collective or checkpoint save with no progress for this many seconds (or 20 "
      "x the median step, if longer) is a stall: every thread's stack is logged and the "
      "run exits 75, which the launchers relaunch. 0: never.", resumable=True)
  inject_stall_at: tuple[int, ...] = field((),
      "Fault injection (tests): (step, process) hangs.", resumable=True)

  def __post_init__(self):
    for name in ("num_train_steps", "batch_size", "log_every_steps", "eval_every_steps",
                 "checkpoint_every_steps", "keep_checkpoints", "average_last",
                 "num_eval_batches",
                 "batch_tokens", "max_length_buckets", "grad_accum_steps",
                 "max_nonfinite_in_row"):
      _check(getattr(self, name) >= 1, f"train.{name}", getattr(self, name), ">= 1")
    _check(self.batching in BATCHING, "train.batching", self.batching, f"one of {BATCHING}")
    _check(self.batch_tokens_count in TOKEN_COUNTS, "train.batch_tokens_count",
           self.batch_tokens_count, f"one of {TOKEN_COUNTS}")
    _check(self.paper_row in PAPER_ROWS, "train.paper_row", self.paper_row,
           f"one of {PAPER_ROWS}")
    _check(self.prefetch >= 0, "train.prefetch", self.prefetch, ">= 0 (0: no prefetching)")
    for name in ("eval_every_epochs", "checkpoint_every_epochs"):
      _check(getattr(self, name) >= 0 and (not getattr(self, name) or
                                           self.batching == "tokens"),
             f"train.{name}", getattr(self, name),
             '>= 0, and 0 unless train.batching="tokens" (whose epochs have a fixed number '
             "of steps)")
    _check(self.bleu_every_steps >= 0, "train.bleu_every_steps", self.bleu_every_steps,
           ">= 0 (0: only at the end)")
    _check(self.num_samples >= 0, "train.num_samples", self.num_samples, ">= 0")
    _check_rate("train", "label_smoothing", self.label_smoothing)
    _check(len(self.mesh_shape) == len(MESH_AXES), "train.mesh_shape", self.mesh_shape,
           f"one size per mesh axis {MESH_AXES}, one of which may be -1")
    _check(self.loss_chunk_length >= 0, "train.loss_chunk_length", self.loss_chunk_length,
           ">= 0 (0: no chunks)")
    choices = KERNEL_CHOICES["train.loss_kernel"]
    _check(self.loss_kernel in choices and not (self.loss_kernel != "xla" and
                                                self.loss_chunk_length),
           "train.loss_kernel", self.loss_kernel, f"one of {choices}, and 'xla' with "
           "train.loss_chunk_length (two ways of never writing the logits: pick one)")
    _check(0 <= self.perturb_init_ulps <= 1000, "train.perturb_init_ulps",
           self.perturb_init_ulps, "between 0 and 1000")
    _check(self.rng_impl in RNG_IMPLS, "train.rng_impl", self.rng_impl, f"one of {RNG_IMPLS}")
    _check(self.on_nonfinite in ("skip", "stop"), "train.on_nonfinite", self.on_nonfinite,
           "'skip' or 'stop'")
    _check(self.keep_best_by in ("", *KEEP_BEST_BY) and (self.bleu_every_steps or KEEP_BEST_BY
           .get(self.keep_best_by, "eval") == "eval"), "train.keep_best_by", self.keep_best_by,
           f"'' or one of {tuple(KEEP_BEST_BY)}; BLEUs need train.bleu_every_steps > 0")
    _check(self.early_stop_patience == 0 or (self.early_stop_patience > 0 and
                                              bool(self.keep_best_by)),
           "train.early_stop_patience", self.early_stop_patience, ">= 0, and 0 unless "
           "train.keep_best_by names the metric")
    object.__setattr__(self, "inject_nonfinite_at", tuple(self.inject_nonfinite_at))
    object.__setattr__(self, "inject_stall_at", tuple(self.inject_stall_at))
    _check(len(self.inject_stall_at) in (0, 2), "train.inject_stall_at", self.inject_stall_at,
           "() or (step, process)")
    # JSON round trips turn tuples into lists; Flax wants tuples.
    rules = tuple((str(name), tuple(axis) if isinstance(axis, (list, tuple)) else axis)
                  for name, axis in self.logical_axis_rules)
    for name, axis in rules:
      _check(all(a in (*MESH_AXES, None) for a in (axis if isinstance(axis, tuple) else (axis,))),
             "train.logical_axis_rules", (name, axis), f"mesh axes among {MESH_AXES} or None")
    object.__setattr__(self, "logical_axis_rules", rules)
    object.__setattr__(self, "mesh_shape", tuple(self.mesh_shape))


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Which corpus, and how it is tokenized (default: WMT14 EN-DE, as the paper).

  task: a dataset, by the name of its module in transformer_jax/data/datasets/
  (docs/data.md): it checks here what it needs of the other fields (its `check`).
  """

  task: str = field("tfds", "The dataset: the name of a module in "
      "transformer_jax/data/datasets/ (docs/data.md; docs/extending.md adds one).")
  source_lang: str = field("en", "Translate from this language...")
  target_lang: str = field("de", "...into this one.")
  tfds_name: str = field("wmt14_translate/de-en:1.0.0",
      'task="tfds": NAME/CONFIG:VERSION (a version pinned: the same text on every machine).')
  tfds_data_dir: str = field("",
      "\"\" = TFDS's default (~/tensorflow_datasets).", resumable=True)
  manual_dir: str = field("",
      "Offline: the original archives / files, for TFDS to build from.", resumable=True)
  train_split: str = field("train", "TFDS split names.")
  eval_split: str = field("validation", "WMT14: newstest2013.", resumable=True)
  test_split: str = field("test", "WMT14: newstest2014.", resumable=True)
  train_files: str = field("", 'task="text": "SOURCE_FILE,TARGET_FILE".')
  eval_files: str = field("",
      'task="text": held-out pairs, as train_files.', resumable=True)
  test_files: str = field("", 'Test pairs, as train_files (task="text"); for a TFDS task '
      "they replace its test split (e.g. newstest2014 from sacreBLEU: docs/paper.md).",
      resumable=True)
  vocab_size: int = field(37_000,
      "SentencePiece vocabulary, shared by both sides (Sec. 5.1); with tokenizer_type="
      '"subword_nmt", the number of BPE merges (the vocabulary is then every subword of '
      "the training split).")
  tokenizer_type: str = field("bpe", 'SentencePiece model_type: "bpe" or "unigram". '
      'Option, for recipes of the Multi30k literature (Wu et al. 2021): "subword_nmt", '
      "joint BPE learned and applied by subword-nmt on the whole (pretokenized) training "
      "split, as their fairseq data was made (data/tokenizer.py). \"marian\": a Marian "
      "model's SentencePiece files and vocabulary, brought in by import_model (never "
      "trained here).")
  pretokenize: str = field("",
      '"": SentencePiece reads the raw text (the paper). Option, for recipes of the '
      'Multi30k literature (Wu et al. 2021): "moses_lowercase" lowercases, normalizes '
      "punctuation and Moses-tokenizes each side first, and detokenizes translations "
      "(data/pretokenize.py).")
  tokenizer_sentences: int = field(2_000_000,
      "Sentences sampled (seeded) for SentencePiece.")
  tokenizer_file: str = field("",
      "A trained SentencePiece model to use (shared by a sweep's runs).")
  max_length: int = field(256, "Longest tokenized training sentence (tokens, with EOS).")
  overlong: str = field("drop", 'Training pairs over max_length: "drop" or "truncate".')
  cache_dir: str = field("",
      "The tokenized training split, memory-mapped (tasks.cache_dir): \"\" = the workdir's "
      "tokenized/ (local workdirs) or ~/.cache/transformer_jax/tokenized. A bucket "
      "(gs://...) is shared: each host copies the split from there to that local folder, "
      "and the first to tokenize it puts it there (main --prepare_data, once).",
      resumable=True)
  num_train_examples: int = field(200_000, 'task="numbers" only.')
  num_eval_examples: int = field(1000, 'task="numbers" only.')

  def __post_init__(self):
    dataset = DATASETS.get(self.task, "config.data.task")
    _check(self.tokenizer_type in TOKENIZER_TYPES, "data.tokenizer_type",
           self.tokenizer_type, f"one of {TOKENIZER_TYPES}")
    _check(self.pretokenize in PRETOKENIZERS, "data.pretokenize", self.pretokenize,
           f"one of {PRETOKENIZERS}")
    _check(self.overlong in ("drop", "truncate"), "data.overlong", self.overlong,
           "'drop' or 'truncate'")
    for name in ("vocab_size", "max_length", "num_train_examples", "num_eval_examples",
                 "tokenizer_sentences"):
      _check(getattr(self, name) >= 1, f"data.{name}", getattr(self, name), ">= 1")
    dataset.check(self)  # What this dataset needs of the fields (its files, ...).
