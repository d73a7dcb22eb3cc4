"""Commands that measure and print speed and memory, apart from the model and the loop:
`speed` (training and decoding speed, MFU, memory: `python -m transformer_jax.benchmark`),
`decoding` (beam search, beside CTranslate2 or an earlier revision), `peers` (the train
step beside the Flax WMT example's and PyTorch's), `lookup_gradient` (the embedding
lookup's gradient alone), `kernel_check` (the Pallas kernels' error and time),
`checkpointing` (waiting on checkpoints over the averaging window), `input_pipeline`
(the data path at WMT size) and `suite` (the accelerator suite an offline bundle runs);
`timing`, `workload`, `phases` and `step_profile` are their shared parts. What is known
before a run, compiled but not run (the fit check, the roofline, the cost), is in
transformer_jax/planning/."""
