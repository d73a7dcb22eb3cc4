"""The data path: parallel text in (`corpora`; the datasets `data.task` names, one
module each in `datasets/`: files, TFDS, Multi30k, the generated numbers of
`number_words`), optionally Moses-tokenized first (`pretokenize`),
subword ids out (`tokenizer`, SentencePiece; `tokenized`,
the memory-mapped token cache), batches for the steps (`batching`), and `tasks`, which
puts them together for a config. No module here imports flax."""

# The config before any module here: making its default DataConfig imports the dataset
# it names (DataConfig checks data.task with the dataset's module), which imports
# corpora, so corpora must never be the module whose import starts the config's.
import transformer_jax.config  # noqa: F401
