"""Training: `loop.train_and_evaluate(config, workdir)`, the one hand-off from the command
line, runs the loop; `loop_parts` holds its small parts (cadences, the log window, the
non-finite policy, the in-flight bound, prefetching). `setup` wires a run (model, mesh,
sharded state, compiled programs); `step` is the jitted train and eval step; `losses`,
`optimizer` (Adam, Sec. 5.3) and `metrics` are what the step computes. Around the loop:
`checkpoint` (orbax), `early_stopping` (the best checkpoint, patience), `summaries`
(TensorBoard), `preemption` and `watchdog` (signals, stalls)."""
