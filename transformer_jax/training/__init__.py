"""Training: `loop.train_and_evaluate(config, workdir)`, the one hand-off from the command
line, runs the loop. Wiring: `run` (checked config, data, model, mesh, sharded state,
jitted steps) and `compilation` (every program compiled before the first step); `step`
is the jitted train and eval step, `optimizer` (Adam, Sec. 5.3) and `metrics` what it
computes. The loop's parts: `cadence`, `progress` (the log window), `evaluation` (the
held-out loss, BLEU and the final evaluation), `averaging` (the checkpoint average),
`saving` (when checkpoints are written), `nonfinite`, `run_ahead` (prefetch, steps in
flight), `early_stopping`, `preemption` and `watchdog`. The run folder: `run_files`
(config, results, exit) and `workdir_lock` (one writer). The checkpoint store and the
TensorBoard writer sit above this package: inference reads them too, and imports
nothing here."""
