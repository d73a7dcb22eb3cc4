"""The model: the encoder-decoder Transformer (`transformer`, Sec. 3), multi-head
attention and its masks (`attention`, Sec. 3.2) with the implementations that compute
it, one module each (`attention_implementations/`), and the search over its outputs,
greedy, beam (Sec. 6.1) and sampling (`beam_search`); `losses`, the label-smoothed loss
(Sec. 5.4) and the teacher-forced log-probabilities that training and scoring share.
Imports no optax, orbax or data code."""
