"""transformer-jax: the Transformer of "Attention Is All You Need" in JAX and Flax.

  model/       the encoder-decoder (transformer.py), its attention, and the search
               over its outputs: greedy, beam and sampling (beam_search.py)
  training/    train_and_evaluate's loop (loop.py), the jitted step, the optimizer
               and schedule, early stopping, the run folder's files and lease;
               inference imports none of it
  inference/   a trained run restored, averaged or ensembled; translation and BLEU;
               scoring given translations; the CTranslate2 export
  data/        corpora, the tokenizers (SentencePiece, subword-nmt), batches as a
               function of the step
  benchmarks/  speed, memory and input-pipeline benchmarks (`python -m
               transformer_jax.benchmarks.suite`, `.input_pipeline`)
  planning/    before a run: the fit check compiled for GPUs and TPU slices that are
               not here, the roofline of a compiled step, the launcher's cost model

The modules at this level are the commands (`python -m transformer_jax.X`: main,
translate, evaluate, score, export, benchmark, config; each defines its flags in
`define_flags()` and runs through `cli.run`) and what they all share: the config and
its metric table (config/), flags and exit codes (cli.py), files on any filesystem
(files.py), when a stop may act (stop_policy.py), the checkpoint store
(checkpoint.py), TensorBoard events (summaries.py), the device mesh and its rules
(partitioning.py), the multi-process runtime and the compilation cache.
"""
