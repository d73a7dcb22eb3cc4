"""Where a traced step goes (transformer_jax/benchmarks/step_profile.py): the trace's
kernels joined to the compiled program by name, idle time, and the floors."""

import pytest

from transformer_jax.benchmarks import step_profile
from transformer_jax.planning import roofline


def _kernel(name, category, flops=0.0, bytes_=1000):
  return roofline.Kernel(name, "fusion", flops, bytes_, category)


def test_the_categories_and_idle_add_up_to_the_traced_steps():
  program = [_kernel("custom-call.1", "matrix products", flops=4e9),
             _kernel("loop_add_fusion", "dropout"), _kernel("copy.2", "copies and transposes")]
  device, host = 7, 3
  event = lambda name, ts, dur, pid=device, module="jit_train_step": {
      "ph": "X", "pid": pid, "name": name, "ts": ts, "dur": dur,
      "args": {"hlo_op": name, "hlo_module": module}}
  events = [{"ph": "M", "name": "process_name", "pid": device,
             "args": {"name": "/device:GPU:0"}},
            {"ph": "M", "name": "process_name", "pid": host, "args": {"name": "/host:CPU"}},
            event("custom-call.1", 0, 400), event("loop_add_fusion", 500, 100),
            event("copy.2", 550, 100),  # On another stream: overlaps by 50 us.
            event("fusion.9", 700, 100),  # Not in the program: counted, named as such.
            event("custom-call.1", 1000, 400),  # The second step, after a 200 us gap.
            event("custom-call.1", 0, 999, pid=host),  # Host events are not the device's.
            event("while.3", 450, 400),  # A loop around kernels: theirs is its time.
            event("other.1", 1500, 100, module="jit_eval_step")]  # Another program.
  split = step_profile.breakdown(events, program, steps=2, flops_per_s=1e12,
                                 bytes_per_s=1e9, containers={"while.3"})
  rows = split["categories"]
  assert split["step_ms"] == pytest.approx(1.4 / 2)  # 0 to 1400 us, over 2 steps.
  assert rows["matrix products"]["ms"] == pytest.approx(0.8 / 2)
  assert rows["dropout"]["ms"] == pytest.approx(0.1 / 2)
  assert rows["not in the program"]["ms"] == pytest.approx(0.1 / 2)
  assert rows["idle"]["ms"] == pytest.approx((0.1 + 0.05 + 0.2) / 2)  # Between kernels.
  assert split["overlap_ms"] == pytest.approx(0.05 / 2)
  assert sum(r["ms"] for r in rows.values()) == pytest.approx(split["step_ms"] +
                                                              split["overlap_ms"])
  assert rows["matrix products"]["floor_ms"] == pytest.approx(4.0)  # 4e9 / 1e12 s.
  assert rows["idle"]["share"] == pytest.approx(0.35 / 1.4)


def test_a_trace_without_the_programs_kernels_gives_no_breakdown():
  assert step_profile.breakdown([], [_kernel("a", "dropout")], 1, 1e12, 1e9) == {}
