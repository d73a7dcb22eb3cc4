"""Measurements and compile-only checks, apart from the model and the loop: `speed`
(training and decoding speed, MFU, memory: `python -m transformer_jax.benchmark`),
`decoding` (beam search beside CTranslate2), `lookup_gradient` (the embedding
lookup's gradient alone), `input_pipeline` (the data path at WMT
size), `suite` (the accelerator suite an offline bundle runs), `phases` (figures kept
phase by phase), `aot` (fit checks compiled ahead of time), `topology` (datasheet
peaks, and compile-only TPU slices and GPUs) and `huggingface_parity` (a run's
translations beside its Hugging Face export's, through transformers)."""
