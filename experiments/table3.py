"""Table 3 of the paper: variations of the base model, scored on newstest2013.

Rows: (A) heads at constant compute, (B) smaller attention keys, (C) model size,
(D) dropout and label smoothing, (E) learned positional embeddings. Each trial changes
only what its row changes; everything else is the base model on WMT14 EN-DE. As Sec.
6.2 scored them: on newstest2013 (the eval split), with beam search as in Sec. 6.1 but
no checkpoint averaging, and newstest2014 left alone.
"""

from launch import sweep

CONFIG = "configs/transformer.py:base"


# Sec. 6.2: "We used beam search as described in the previous section, but no
# checkpoint averaging."
SCORED_AS_SEC_6_2 = {"train.average_last": 1, "train.final_test": False}


def trials():
  return sweep.named(**{name: {**SCORED_AS_SEC_6_2, **row} for name, row in ROWS.items()})


ROWS = dict(
      base={},
      # (A) h with d_k = d_v = d_model / h.
      A_heads1={"model.num_heads": 1}, A_heads4={"model.num_heads": 4},
      A_heads16={"model.num_heads": 16}, A_heads32={"model.num_heads": 32},
      # (B) d_k below d_model / h (d_v stays 64).
      B_dk16={"model.key_dim": 16}, B_dk32={"model.key_dim": 32},
      # (C) depth, width (d_k = d_v = d_model / 8) and feed-forward size.
      C_layers2={"model.num_encoder_layers": 2, "model.num_decoder_layers": 2},
      C_layers4={"model.num_encoder_layers": 4, "model.num_decoder_layers": 4},
      C_layers8={"model.num_encoder_layers": 8, "model.num_decoder_layers": 8},
      C_dmodel256={"model.d_model": 256}, C_dmodel1024={"model.d_model": 1024},
      C_dff1024={"model.d_ff": 1024}, C_dff4096={"model.d_ff": 4096},
      # (D) residual dropout and label smoothing.
      D_dropout0={"model.dropout_rate": 0.0}, D_dropout02={"model.dropout_rate": 0.2},
      D_smoothing0={"train.label_smoothing": 0.0},
      D_smoothing02={"train.label_smoothing": 0.2},
      # (E) learned positional embeddings instead of sinusoids.
      E_learned_positions={"model.learned_positions": True},
  )
