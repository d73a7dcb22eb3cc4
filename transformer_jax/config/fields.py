"""How a config field is declared and checked, and the values fields choose among: the
vocabularies of choices, the token ids, the mesh's axes and its default rules, and the
metrics a run reports."""

from __future__ import annotations


import dataclasses
from typing import Any, NamedTuple

DTYPES = ("float32", "bfloat16")
ACTIVATIONS = ("relu", "swish", "gelu")  # model.activation
PRETOKENIZERS = ("", "moses_lowercase")  # data.pretokenize (data/pretokenize.py).
MESH_AXES = ("data", "fsdp", "tensor")  # The device mesh's axes, in this order.
# Token ids that the model (padding masks; 0 also starts the decoder), the search and
# the tokenizer (SentencePiece trained with these ids; no begin-of-sentence id) share.
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2

# Logical axis name -> mesh axis. With fsdp = tensor = 1 this is plain data parallelism;
# fsdp > 1 shards parameters and optimizer state along `embed`; tensor > 1 splits heads,
# feed-forward and vocabulary (Megatron style). Activations: batch over data and fsdp.
DEFAULT_LOGICAL_AXIS_RULES = (
    ("activation_batch", ("data", "fsdp")), ("activation_length", None),
    ("activation_embed", None), ("activation_heads", "tensor"), ("activation_kv", None),
    ("activation_mlp", "tensor"), ("activation_vocab", "tensor"),
    ("vocab", "tensor"), ("embed", "fsdp"), ("heads", "tensor"), ("kv", None),
    ("mlp", "tensor"), ("length", None),
    ("layers", None),  # model.scan_layers: the stacked layers' axis.
)


def round_up(n, multiple: int):
  """`n` (an int or an integer array) rounded up to a multiple of `multiple`: padded
  vocabularies, batch rows split over devices, sequence lengths padded to buckets."""
  return -(-n // multiple) * multiple


def field(default: Any, doc: str, resumable: bool = False) -> Any:
  """A config field: its default, what it means (docs/config.md is made from these) and
  whether a resumed run may change it (checkpoint.check_resume). Resumable: length,
  cadence, placement, decoding, evaluation data and the optimizer's numbers. Any other
  field (the model, the optimizer's structure, the tokenizer, the training data and its
  order) would not match the checkpoints, so changing it refuses to resume."""
  return dataclasses.field(default=default, metadata={"doc": doc, "resumable": resumable})


class InputError(ValueError):
  """A mistake in a config, flag or input file: reported in one line, exit code 2."""


class NotPrepared(InputError):
  """Data that a run of several processes reads was not prepared before it started: such
  a run never downloads or builds (main --prepare_data does, once)."""


def check(ok: bool, field: str, value: Any, valid: str) -> None:
  if not ok:
    raise InputError(f"config.{field}={value!r} is invalid: expected {valid}.")


def check_rate(section: str, name: str, value: float) -> None:
  check(0.0 <= value < 1.0, f"{section}.{name}", value, "a rate in [0, 1)")


class Metric(NamedTuple):
  computed: str  # Held out: "eval" (the loss pass) or "bleu" (translating), or "train".
  lower_is_better: bool


# Every metric a run reports, by the name under eval/, train/ or an evaluation's NAME/:
# when it is computed and which way it improves. The one table behind train.keep_best_by,
# early stopping, the scores of a translation (inference/bleu.py) and launch.results.
METRICS = {
    "loss": Metric("eval", True), "nll": Metric("eval", True),
    "perplexity": Metric("eval", True), "accuracy": Metric("eval", False),
    "bleu": Metric("bleu", False), "bleu_lc": Metric("bleu", False),
    "chrf": Metric("bleu", False), "paper_bleu": Metric("bleu", False),
    "paper_bleu_2018": Metric("bleu", False), "lowercase_bleu": Metric("bleu", False),
    "exact_match": Metric("bleu", False)}
# train.keep_best_by's choices -> when they are computed.
KEEP_BEST_BY = {f"eval/{name}": m.computed for name, m in METRICS.items()
                if name not in ("perplexity", "exact_match")}


def lower_is_better(tag: str) -> bool:
  """Whether the metric `tag` (eval/loss, train/nll, test_avg5/bleu, ...) improves
  downwards; a tag outside METRICS (learning rate, speed) counts as upwards."""
  metric = METRICS.get(tag.rsplit("/", 1)[-1])
  return metric is not None and metric.lower_is_better
TOKENIZER_TYPES = ("bpe", "unigram", "subword_nmt", "marian")
BATCHING = ("tokens", "packed", "sentences")
TOKEN_COUNTS = ("real", "padded")  # What train.batch_tokens counts.
PAPER_ROWS = ("", "base", "big")  # Rows of the paper's Table 2 (train.paper_row).
# The values of each kernel option: "xla" (XLA's fusions) or those of its rows in the
# table of this project's Pallas kernels, kernels.KERNELS (tests/kernels/test_table.py
# holds the two equal). The loss also has "hybrid": Pallas kernels and cuBLAS products.
KERNEL_CHOICES = {"model.norm_kernel": ("xla", "pallas"),
                  "model.ffn_kernel": ("xla", "pallas"),
                  "train.loss_kernel": ("xla", "pallas", "hybrid")}
RNG_IMPLS = ("threefry", "rbg", "unsafe_rbg")
