"""Measurements and compile-only checks, apart from the model and the loop: `speed`
(training and decoding speed, MFU, memory: `python -m transformer_jax.benchmark`),
`decoding` (beam search beside CTranslate2), `lookup_gradient` (the embedding
lookup's gradient alone), `input_pipeline` (the data path at WMT
size), `suite` (the accelerator suite an offline bundle runs), `phases` (figures kept
phase by phase), `aot` (fit checks compiled ahead of time) and `topology` (datasheet
peaks, and compile-only TPU slices and GPUs)."""
