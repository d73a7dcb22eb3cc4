"""What a run needs and costs, known before it runs, from programs compiled but never
executed: `topology` (datasheet peaks; TPU slices and GPUs that are not here, as
compile-only devices), `fit` (the train, eval and beam-search programs compiled for
them: memory a chip, whether it fits, what would), `roofline` (where a step's time
goes, predicted from its compiled program) and `cost` (hours and device-hours, part by
part). `benchmark --aot/--topology` and the launcher's dry run print them."""
