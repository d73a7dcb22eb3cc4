"""Transformer configs: `--config=configs/transformer.py:NAME[,smoke]` with NAME one of

  base      the paper's base model on WMT14 EN-DE (TFDS wmt14_translate/de-en:1.0.0),
            Table 3 row "base" (Sec. 5-6): exactly the defaults of
            transformer_jax/config/sections.py.
  big       the paper's big model on WMT14 EN-DE (P_drop 0.3, 300k steps).
  base_enfr, big_enfr   the same on WMT14 EN-FR (32k word pieces; big uses P_drop 0.1).
  numbers   the embedded default: English -> German number words, generated here, no
            download; 2.5-5 minutes on a 2-core CPU (the README's first command).
  multi30k  Multi30k English -> German, the 2.3M-parameter Transformer-tiny of Wu et al.
            (2021), 8,000 steps sized for a CPU (docs/results.md: time and BLEU).
  multi30k_wu2021   Wu et al. (2021)'s own recipe for it, setting by setting, as their
            fairseq code ran it (their lowercased Moses tokens and subword-nmt BPE,
            dropout 0.3, 8,192 tokens a step, validation and patience per epoch); evaluate it as they did
            with `evaluate --average_last=10` (docs/results.md).

Each config writes only what it changes from those defaults. `,smoke` keeps the data
source but shrinks everything else (model, vocabulary, steps, length buckets) for a
quick check of the whole path. Any field can then be overridden:
`--config.model.num_heads=16`.
"""

import ml_collections

from transformer_jax import config as config_lib

SIZES = ("numbers", "multi30k", "multi30k_wu2021", "base", "big", "base_enfr", "big_enfr")


def get_config(arg: str = "numbers") -> ml_collections.ConfigDict:
  size, *modifiers = arg.split(",")
  if size not in SIZES or set(modifiers) - {"smoke"}:
    raise ValueError(f"Unknown config {arg!r}; valid: one of {', '.join(SIZES)}, "
                     "optionally followed by ',smoke'.")
  c = config_lib.defaults()  # The paper's base model on WMT14 EN-DE.
  if size in ("base", "big", "base_enfr", "big_enfr"):  # Table 2's BLEU beside the run's.
    c.train.paper_row = size.split("_")[0]
  if size.endswith("_enfr"):  # 32k word pieces for EN-FR (Sec. 5.1).
    c.data.update(tfds_name="wmt14_translate/fr-en:1.0.0", target_lang="fr", vocab_size=32_000,
                  tokenizer_type="unigram")
  if size.startswith("big"):
    # Table 3 "big"; P_drop 0.3 for EN-DE, 0.1 for EN-FR (Sec. 6.1).
    c.model.update(d_model=1024, num_heads=16, d_ff=4096,
                   dropout_rate=0.1 if size.endswith("_enfr") else 0.3)
    # 1.0 s/step: every 10 minutes is 600 steps; the last 20 are averaged (Sec. 6.1).
    c.train.update(num_train_steps=300_000, checkpoint_every_steps=600, keep_checkpoints=20,
                   average_last=20)
  recipes = {"numbers": _numbers, "multi30k": _multi30k, "multi30k_wu2021": _multi30k_wu2021}
  if size in recipes:
    recipes[size](c)
  if "smoke" in modifiers:
    _smoke(c)
  return c


def _numbers(c: ml_collections.ConfigDict) -> None:
  c.model.update(d_model=128, num_heads=4, num_encoder_layers=1, num_decoder_layers=1,
                 d_ff=512, max_len=128)
  c.data.update(task="numbers", vocab_size=100, max_length=48)
  c.optimizer.update(warmup_steps=300)
  # The held-out score is the mean of the last 5 checkpoints, 20 steps apart, as the
  # paper's base (Sec. 6.1): the last step's alone moves 78-93 sacreBLEU with rounding
  # (docs/results.md). 4,096 positions a step, padding counted: the batch its time and
  # BLEU were measured with.
  c.train.update(num_train_steps=600, batch_tokens=4096, batch_tokens_count="padded",
                 log_every_steps=100, eval_every_steps=200, bleu_every_steps=0,
                 checkpoint_every_steps=20, keep_checkpoints=5, average_last=5,
                 num_eval_batches=8)
  c.decode.update(max_extra_length=20)


def _multi30k(c: ml_collections.ConfigDict) -> None:
  # The Transformer-tiny of Wu et al. (2021); dropout and learning rate chosen on val
  # by experiments/multi30k_recipe.py (docs/results.md).
  c.model.update(d_model=128, num_heads=4, num_encoder_layers=4, num_decoder_layers=4,
                 d_ff=256, max_len=256, dropout_rate=0.1)
  c.data.update(task="multi30k", vocab_size=8000, max_length=64)
  c.optimizer.update(warmup_steps=2000, learning_rate_multiplier=2.5)
  # 4,096 positions a step, padding counted, as the search that chose it (docs/results.md).
  c.train.update(num_train_steps=8000, batch_tokens=4096, batch_tokens_count="padded",
                 log_every_steps=100, eval_every_steps=500, bleu_every_steps=1000,
                 checkpoint_every_steps=250, keep_checkpoints=10, average_last=10,
                 keep_best_by="eval/bleu")
  c.decode.update(beam_size=5)  # As Wu et al.; test scores average the last 10.


def _multi30k_wu2021(c: ml_collections.ConfigDict) -> None:
  # Wu et al. (2021), github.com/LividWo/Revisit-MMT: README-baseline.md's train.py
  # flags, and their fairseq fork's defaults for what the flags leave out.
  # --arch transformer_tiny --share-all-embeddings --dropout 0.3; post-norm, sinusoids,
  # no attention or ReLU dropout, embeddings scaled by sqrt(d): the defaults here too.
  # fairseq's MultiheadAttention starts q, k and v at Glorot with gain 1/sqrt(2).
  c.model.update(d_model=128, num_heads=4, num_encoder_layers=4, num_decoder_layers=4,
                 d_ff=256, max_len=256, dropout_rate=0.3, share_embeddings=True,
                 qkv_init_scale=0.5)
  # Their data: lowercased, normalized, Moses-tokenized, then subword-nmt's joint BPE,
  # 10,000 merges (their data/multi30k-en-de/code), and fairseq-preprocess
  # --joined-dictionary (9,708 subwords). From these tokens subword-nmt learns the same
  # 10,000 merges and vocabulary (experiments/multi30k_wu2021.py, docs/results.md).
  c.data.update(task="multi30k", pretokenize="moses_lowercase",
                tokenizer_type="subword_nmt", vocab_size=10_000, max_length=128)
  # --lr 0.005 --warmup-updates 2000, fairseq's default --lr-scheduler inverse_sqrt with
  # --warmup-init-lr 1e-7; default --optimizer adam, --adam-betas (0.9, 0.98),
  # --adam-eps 1e-8, --weight-decay 0; default --clip-norm 25.
  c.optimizer.update(schedule="fairseq", peak_learning_rate=0.005, warmup_init_lr=1e-7,
                     warmup_steps=2000, beta1=0.9, beta2=0.98, epsilon=1e-8,
                     grad_clip_norm=25.0)
  # --max-tokens 4096 on each of 2 GPUs: 8,192 tokens an update (padding counted);
  # --max-update 8000; default label_smoothed_cross_entropy with smoothing 0.1; it
  # validates every epoch (--validate-interval 1) on all of val, saves every epoch
  # (--save-interval 1), and --patience 10 stops after 10 epochs without a lower
  # validation loss (--best-checkpoint-metric loss). evaluate.sh averages the last 10
  # epoch checkpoints: 11 are kept, so that a run ending at step 8,000, mid-epoch, still
  # has 10 (`evaluate --average_last=10 --step=LAST_EPOCH_STEP` averages those).
  c.train.update(num_train_steps=8000, batch_tokens=8192, batch_tokens_count="padded",
                 label_smoothing=0.1,
                 log_every_steps=100, eval_every_epochs=1, num_eval_batches=16,
                 bleu_every_steps=0, checkpoint_every_epochs=1, keep_checkpoints=11,
                 average_last=10,
                 keep_best_by="eval/loss", early_stop_patience=10)
  # generate.py --beam 5 (--lenpen 1: log P / |Y|); BLEU4 on their tokens is
  # eval/lowercase_bleu.
  c.decode.update(beam_size=5, length_penalty=1.0, length_penalty_form="fairseq")


def _smoke(c: ml_collections.ConfigDict) -> None:
  """The data source kept, everything else shrunk: a quick check of the whole path."""
  # One layer each, as the embedded default: every code path, and a third less time
  # tracing and lowering than two (a smoke run: about 10 s on a CPU, not 14).
  c.model.update(d_model=32, num_heads=4, num_encoder_layers=1, num_decoder_layers=1,
                 d_ff=64, max_len=128)
  c.data.update(vocab_size=min(c.data.vocab_size, 200), max_length=48,
                num_train_examples=2000, num_eval_examples=32,
                tokenizer_sentences=20_000)
  c.optimizer.update(warmup_steps=10)
  c.train.num_train_steps = 20
  # Cadences follow an overridden count: a quarter and a half of it, rounded up, so
  # at least every step. Two length buckets: two train steps to compile, not eight.
  steps = c.train.get_ref("num_train_steps")
  c.train.update(batch_tokens=1024, max_length_buckets=2, log_every_steps=(steps + 3) // 4,
                 eval_every_steps=(steps + 1) // 2, bleu_every_steps=0,
                 checkpoint_every_steps=(steps + 1) // 2, keep_checkpoints=2, average_last=1,
                 num_eval_batches=1, keep_best_by="", early_stop_patience=0,
                 eval_every_epochs=0, checkpoint_every_epochs=0,
                 # Steps of milliseconds: a checkpoint each, of its own step, not deferred
                 # to whenever the previous one is written.
                 defer_checkpoints=False)
  c.decode.update(beam_size=2, batch_size=32, max_extra_length=10)
