"""transformer-jax: the Transformer of "Attention Is All You Need" in JAX and Flax.

  model/       the encoder-decoder (transformer.py), its attention, and the search
               over its outputs: greedy, beam and sampling (search.py)
  training/    train_and_evaluate's loop (loop.py), the jitted step, the optimizer
               and schedule, early stopping; inference imports none of it
  inference/   a trained run restored, averaged or ensembled; translation and BLEU;
               scoring given translations; the CTranslate2 export
  data/        corpora, the tokenizers (SentencePiece, subword-nmt), batches as a
               function of the step
  benchmarks/  speed, memory and input-pipeline benchmarks, and compile-only checks
               for GPUs and TPU slices that are not here

The modules at this level are the commands (`python -m transformer_jax.X`: main,
translate, evaluate, score, export, benchmark, benchmark_suite, data_benchmark, config)
and what they all share: the config and its metric table (config.py), flags and exit
codes (cli.py), files on any filesystem, the workdir's lease (workdir_lock.py), the
checkpoint store (checkpoint.py), TensorBoard events (summaries.py), the device mesh and
its rules (partitioning.py), the multi-process runtime and the compilation cache.
"""
