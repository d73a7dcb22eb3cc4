"""Commands that measure and print speed and memory: `speed` (training and decoding,
MFU, memory: `python -m transformer_jax.benchmark`), `decoding` (beam search, beside
CTranslate2 or an earlier revision), `peers` (beside the Flax WMT example and PyTorch),
`lookup_gradient`, `kernel_check` (the Pallas kernels' error and time), `checkpointing`
(waiting on checkpoints), `input_pipeline` (the data path at WMT size) and `suite` (what
an offline bundle runs on an accelerator). What is known before a run, compiled but not
run (the fit check, the roofline, the cost), is in transformer_jax/planning/."""
