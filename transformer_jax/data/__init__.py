"""The data path: parallel text in (`corpora`; the datasets `data.task` names, one
module each in `datasets/`: files, TFDS, Multi30k, the generated numbers of
`number_words`), optionally Moses-tokenized first (`pretokenize`),
subword ids out (`tokenizer`, SentencePiece; `tokenized`,
the memory-mapped token cache), batches for the steps (`batching`), and `tasks`, which
puts them together for a config. No module here imports flax."""
