"""Training: `loop.train_and_evaluate(config, workdir)`, the one hand-off from the command
line, runs the loop; `loop_parts` holds its small parts (cadences, the log window, the
non-finite policy, the in-flight bound, prefetching). `setup` wires a run (model, mesh,
sharded state, compiled programs); `step` is the jitted train and eval step;
`optimizer` (Adam, Sec. 5.3) and `metrics` are what the step computes, with the model's
losses. Around the loop: `early_stopping` (the best checkpoint, patience), `preemption`
and `watchdog` (signals, stalls). The checkpoint store and the TensorBoard writer sit
above this package (inference reads and writes them too, and imports nothing here)."""
