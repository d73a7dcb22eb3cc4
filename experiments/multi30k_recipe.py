"""Multi30k EN-DE at the literature's level: the Transformer-tiny of Wu et al. (2021)
(4+4 layers, d_model 128, FFN 256, 4 heads, dropout 0.3), then one factor at a time
around it: dropout, label smoothing, learning rate, warmup, vocabulary, size. Trials are
compared on the validation set only (eval/bleu, every 500 steps, and the last
checkpoints averaged); test_2016_flickr is not read.

From the plain files, without TensorFlow (D: the folder with train/val .en.gz/.de.gz):
  python -m launch --experiment=experiments/multi30k_recipe.py --root=runs \
      --set=data.task=text --set=data.train_files=$D/train.en.gz,$D/train.de.gz \
      --set=data.eval_files=$D/val.en.gz,$D/val.de.gz
"""

from launch import sweep

CONFIG = "configs/transformer.py:multi30k"

RUN = {"train.num_train_steps": 8000, "train.eval_every_steps": 500,
       "train.bleu_every_steps": 500, "train.checkpoint_every_steps": 250,
       "train.keep_checkpoints": 10, "train.keep_best_by": "eval/bleu"}
TINY = {"model.d_model": 128, "model.d_ff": 256, "model.num_heads": 4,
        "model.num_encoder_layers": 4, "model.num_decoder_layers": 4,
        "model.dropout_rate": 0.3, "optimizer.warmup_steps": 2000,
        "optimizer.learning_rate_multiplier": 2.5}  # Peak 0.0049, at step 2000.


def tiny(changes: dict | None = None) -> dict:
  """The run and the Transformer-tiny, with `changes` to them."""
  return {**RUN, **TINY, **(changes or {})}


def trials():
  return sweep.named(
      tiny=tiny(),
      dropout01=tiny({"model.dropout_rate": 0.1}),
      dropout02=tiny({"model.dropout_rate": 0.2}),
      smoothing02=tiny({"train.label_smoothing": 0.2}),
      lr1=tiny({"optimizer.learning_rate_multiplier": 1.0}),
      lr5=tiny({"optimizer.learning_rate_multiplier": 5.0}),
      warmup4000=tiny({"optimizer.warmup_steps": 4000}),
      vocab4000=tiny({"data.vocab_size": 4000}),
      vocab16000=tiny({"data.vocab_size": 16000}),
      layers6=tiny({"model.num_encoder_layers": 6, "model.num_decoder_layers": 6}),
      wide=tiny({"model.d_model": 256, "model.d_ff": 512}),
      small=tiny({"model.d_model": 256, "model.d_ff": 1024, "model.num_encoder_layers": 3,
                  "model.num_decoder_layers": 3}),  # The former CPU-sized recipe's model.
      # Round 2: lower dropout did best early; at the learning rate of 1x (peak 0.002).
      dropout01_lr1=tiny({"model.dropout_rate": 0.1,
                          "optimizer.learning_rate_multiplier": 1.0}),
      dropout02_lr1=tiny({"model.dropout_rate": 0.2,
                          "optimizer.learning_rate_multiplier": 1.0}),
      dropout03_lr1=tiny({"optimizer.learning_rate_multiplier": 1.0}),
  )
