"""Using a trained run: `restore` (its config, tokenizer and parameters: a checkpoint,
the best one, an average, an ensemble), `translation` (whole sets in length-sorted
batches over the devices, scored with `bleu`), `scoring` (log P(target | source) of given
pairs), `ctranslate2` (the export for serving, and translating with it) and
`huggingface` (Hugging Face's MarianMT folders, exported and imported; their weights
mapped by `marian`; `python -m transformer_jax.inference.huggingface_parity` compares an
export's translations with the run's)."""
