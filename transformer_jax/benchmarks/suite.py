r"""The accelerator measurement suite (what an offline bundle's run.sh runs): the paper's
base and big in bfloat16 at 25k-token batches, beam-4 decoding of the 3,003 newstest2014
sources, and a profile of a few base steps and of big's (where a step goes, by
category); one job each, in that order (the most valuable figures first).

  python -m transformer_jax.benchmarks.suite --out=DIR --newstest_dir=DIR \
      [--jobs=base,big,decode,profile,profile_big] [--quick] [--workdir=TRAINED_RUN]

Each job is `python -m transformer_jax.benchmark ... --results=DIR/jobs/NAME.json` in
its own process (a clean device memory for each), with a time budget: it starts no
compile after 60 s less, and is stopped at the budget if still running (a measuring
phase whose programs compiled still starts: a long compile is not paid for nothing).
DIR/results.json is written (atomically) when the suite starts and again after every
phase of every job, so a time limit, a crash or a failing phase loses nothing already
measured: each job's phases say which finished (with their seconds), failed (with the
error) or never ran. Logs go to DIR/log.txt, the profile's trace to DIR/profile/
(TensorBoard's profile plugin or ui.perfetto.dev read it), its top operations to
results.json.

Settings, each kept if already set in the environment:
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.95  JAX preallocates 95% of GPU memory (default
      75%), so that big's 25k-token step has room.
  JAX_COMPILATION_CACHE_DIR=DIR/../jax_cache  Later jobs and runs load what earlier
      ones compiled (run.sh puts it in the bundle's folder instead).
  XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true  Overlaps communication with
      compute (several GPUs); dropped, with a log line, if this XLA rejects it.
The jobs choose cuDNN attention where it fits (model.attention_implementation=auto;
--attention picks another): a job whose attention other than XLA's fails is run again
with XLA's in what is left of its budget, the failure kept in results.json under
`NAME_failure` (`cudnn_failure`). Dropout bits come from the hardware generator
(train.rng_impl=rbg) and the vocabulary is padded to a multiple of 128
(model.vocab_multiple): options, named in results.json. --kernels=norm,ffn,hybrid runs
every job with this project's Pallas kernels (train.loss_kernel=pallas or hybrid,
model.norm_kernel, model.ffn_kernel), for a before and after in one call; "unmerged"
adds train.dot_merger=False, "stacked" model.scan_layers with scan_unroll=6.

--quick runs the same path with the `numbers,smoke` config in a few minutes on a CPU.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

from absl import flags

from transformer_jax import cli, distributed, files, kernels
from transformer_jax.benchmarks.phases import failed, now
from transformer_jax.config import ATTENTION

FLAGS = flags.FLAGS
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPU_ENV = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.95",
           "XLA_FLAGS": "--xla_gpu_enable_latency_hiding_scheduler=true"}
OPTIONS = ["--config.model.dtype=bfloat16", "--config.train.rng_impl=rbg",
           "--config.model.vocab_multiple=128"]
ORDER = ("base", "big", "decode", "profile", "profile_big", "peers", "trained")
# Seconds a job may take, compiles included. On one H200 base, big, decode and profile
# took 124, 127, 63 and 25 s (cached): all four in one 10-minute call (docs/scaling.md).
# The first job on a fresh H100 took 48 s to start and 134 s to compile, so base and big
# have 260 s: room for their train phase after such a compile.
BUDGET_S = {"base": 260, "big": 260, "decode": 150, "profile": 150, "profile_big": 150,
            "peers": 300, "trained": 300}
MODULES = {"peers": "transformer_jax.benchmarks.peers"}  # Else transformer_jax.benchmark.
# The profiles run without command buffers (CUDA graphs): inside one, a trace names the
# buffer as every kernel's instruction (seen on an H200, JAX 0.11.2: "command_buffer_1"
# for a whole step), and no kernel joins its instruction for the breakdown.
PROFILE_XLA_FLAGS = "--xla_gpu_enable_command_buffer="
# --kernels: this project's Pallas kernels (kernels.KERNELS, by name), and the step's
# other options for speed.
KERNEL_FLAGS = {**{k.name: (f"--config.{k.option}={k.value}",) for k in kernels.KERNELS},
                "unmerged": ("--config.train.dot_merger=False",),
                "stacked": ("--config.model.scan_layers=True", "--config.model.scan_unroll=6")}
GRACE_S = 60  # A job starts no compile in its budget's last GRACE_S seconds.


def jobs(quick: bool, workdir: str | None, out: str) -> dict[str, list[str]]:
  """name -> benchmark flags, in ORDER."""
  config = lambda name: f"--config=configs/transformer.py:{name}"
  options = [*OPTIONS, f"--config.model.attention_implementation={FLAGS.attention}",
             *(flag for name in FLAGS.kernels for flag in KERNEL_FLAGS[name])]
  none = ["--decode_sentences=0"]
  if quick:
    # The smoke config (two length buckets, 1,024-token batches, d_model 32) and, for
    # big, twice its width: every program of the real jobs, each compiled and run in
    # seconds on a CPU.
    base = [config("numbers,smoke"), *options, "--pairs=2000"]
    train = ["--steps=5", "--warmup_steps=1"]
    out_jobs = {"base": [*base, *train, *none],
                "big": [*base, *train, *none, "--config.model.d_model=64",
                        "--config.model.d_ff=256"],
                "decode": [*base, "--steps=0", "--decode_sentences=32", "--repeats=1"]}
  else:
    base = [config("base"), *options]
    out_jobs = {"base": [*base, *none], "big": [config("big"), *options, *none],
                "decode": [*base, "--steps=0", "--decode_sentences=3003", "--repeats=1",
                           "--config.decode.batch_tokens=16384",
                           "--config.decode.batch_size=1024"]}
  for name in ("profile", "profile_big"):  # Where a step of base, of big, goes.
    out_jobs[name] = [*(base if name == "profile" else out_jobs["big"]), "--steps=0",
                      *none, f"--profile_dir={os.path.join(out, name)}"]
  out_jobs["peers"] = [*base, "--steps=3" if quick else "--steps=20",
                       *([f"--flax_wmt_dir={FLAGS.flax_wmt_dir}"] if FLAGS.flax_wmt_dir
                         else [])]
  if workdir:
    out_jobs["trained"] = [f"--workdir={workdir}", "--split=test", "--repeats=1"]
  return out_jobs


def environment(out: str) -> dict[str, str]:
  """This process's environment, with GPU_ENV and the compilation cache where unset."""
  cache = os.path.join(os.path.dirname(os.path.abspath(out)), "jax_cache")
  return {**GPU_ENV, "JAX_COMPILATION_CACHE_DIR": cache, **os.environ}


def profile_environment(env: dict[str, str]) -> dict[str, str]:
  return {**env, "XLA_FLAGS": f"{env.get('XLA_FLAGS', '')} {PROFILE_XLA_FLAGS}".strip()}


def check_xla_flags(env: dict[str, str], log) -> dict[str, str]:
  """Drops XLA_FLAGS if this XLA refuses them (an unknown flag is fatal)."""
  probe = subprocess.run(
      [sys.executable, "-c", "import jax; jax.numpy.zeros(1).block_until_ready()"],
      env=env, capture_output=True, text=True)
  if probe.returncode and "XLA_FLAGS" in env:
    log(f"XLA_FLAGS={env['XLA_FLAGS']!r} refused ({probe.stderr.strip()[-300:]}); "
        "running without them")
    env = {k: v for k, v in env.items() if k != "XLA_FLAGS"}
  return env


def code_record(root: str = ROOT) -> dict:
  """The code's fingerprint, and the git revision it came from: a bundle's bundle.json,
  beside its code/, records the revision it was built from (a bundle is often carried
  inside another checkout, whose HEAD says nothing about it); else git's HEAD."""
  record = {"fingerprint": distributed.code_fingerprint(root)}
  bundle_json = os.path.join(root, "..", "bundle.json")
  if os.path.exists(bundle_json):
    with open(bundle_json) as f:
      record["revision"] = json.load(f).get("revision")
    return record
  git = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True,
                       text=True)
  if git.returncode == 0:
    record["revision"] = git.stdout.strip()
  return record



class Suite:
  """The suite's results.json, rewritten whole whenever a job's figures change."""

  def __init__(self, out: str, log):
    self.out, self.log = out, log
    self.path = os.path.join(out, "results.json")
    self.results = {"started": now(), "quick": FLAGS.quick,
                    "command": " ".join(sys.argv), "code": code_record(), "jobs": {}}
    self.write()

  def write(self) -> None:
    files.write_atomic(self.path, json.dumps(self.results, indent=1))

  def run_job(self, name: str, args: list[str], env: dict[str, str],
              budget_s: float) -> dict:
    """One benchmark process under `budget_s`; its figures as they were after its last
    phase, with the exit, or how it was stopped."""
    figures_path = os.path.join(self.out, "jobs", f"{name}.json")
    if os.path.exists(figures_path):
      os.remove(figures_path)  # A stale file from an earlier run is not this run's.
    command = [sys.executable, "-m", MODULES.get(name, "transformer_jax.benchmark"), *args,
               f"--results={figures_path}", f"--budget_s={max(budget_s - GRACE_S, 0):.0f}"]
    self.log("$ " + " ".join(command[1:]))
    start = time.time()
    job = {"command": " ".join(command[1:]), "budget_s": budget_s,
           "xla_flags": env.get("XLA_FLAGS", "")}
    proc = subprocess.Popen(command, env={**env, "PYTHONUNBUFFERED": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    stopped = threading.Event()
    timer = threading.Timer(budget_s, lambda: (stopped.set(), proc.kill()))
    timer.start()
    tail = []
    def update(**extra):
      if os.path.exists(figures_path):
        with open(figures_path) as f:
          job.update(json.load(f))
      job.update(seconds=time.time() - start, **extra)
      self.results["jobs"][name] = job
      self.write()
    try:
      for line in proc.stdout:
        line = line.rstrip("\n")
        self.log(line)
        tail = (tail + [line])[-20:]
        if line.startswith("phase "):  # A phase ended before this line: keep its figures.
          update()
      code = proc.wait()
    except BaseException:  # The suite itself is stopped: keep what the job measured.
      proc.kill()
      update(stopped="the suite was interrupted", log_tail=tail)
      raise
    finally:
      timer.cancel()
    if stopped.is_set():
      update(stopped=f"over its budget of {budget_s:.0f} s", log_tail=tail)
    else:
      update(exit=code, **({"log_tail": tail} if code else {}))
    return job


def _interrupt(signum, frame):
  """A stop (timeout's SIGTERM) unwinds like Ctrl-C, so the running job's figures are kept."""
  raise KeyboardInterrupt


def job_failed(job: dict) -> bool:
  return bool(job.get("exit") or job.get("stopped") or failed(job))


def main():
  if not FLAGS.out:
    cli.fail("--out=DIR is required.")
  os.makedirs(FLAGS.out, exist_ok=True)
  every = jobs(FLAGS.quick, FLAGS.workdir, FLAGS.out)
  chosen = FLAGS.jobs or list(every)
  if unknown := [j for j in chosen if j not in every]:
    cli.fail(f"--jobs: unknown {unknown}; valid: {list(every)}"
             + ("" if FLAGS.workdir else " (trained needs --workdir)"))
  log_file = open(os.path.join(FLAGS.out, "log.txt"), "a")
  def log(line: str) -> None:
    print(line, flush=True)
    log_file.write(line + "\n")
    log_file.flush()
  signal.signal(signal.SIGTERM, _interrupt)
  suite = Suite(FLAGS.out, log)
  env = check_xla_flags(environment(FLAGS.out), log)
  suite.results["environment"] = {k: env[k] for k in (*GPU_ENV, "JAX_COMPILATION_CACHE_DIR")
                                  if k in env}
  news = [f"--newstest_dir={FLAGS.newstest_dir}"] if FLAGS.newstest_dir else []
  try:
    for name in sorted(chosen, key=ORDER.index):
      budget = FLAGS.job_budget_s or BUDGET_S[name]
      log(f"== {name} (budget {budget:.0f} s)")
      args = every[name] + (news if name != "trained" else [])
      start = time.time()
      job = suite.run_job(name, args, profile_environment(env) if name.startswith("profile")
                          else env, budget)
      left = budget - (time.time() - start)
      if (attention := job.get("attention", "xla")) != "xla" and job_failed(job):
        failure = {k: job.get(k) for k in ("phases", "exit", "stopped", "log_tail")}
        if left < GRACE_S:
          job[f"{attention}_failure"] = {**failure, "retry": f"not tried: {left:.0f} s left"}
          suite.write()
          continue
        log(f"== {name} again with XLA's attention ({attention} attention failed)")
        job = suite.run_job(name, args + ["--config.model.attention_implementation=xla"],
                            env, left)
        job[f"{attention}_failure"] = failure
        suite.write()
  except KeyboardInterrupt:
    log("stopped; results.json keeps every phase that finished")
    return 130
  finally:
    suite.results["ended"] = now()
    suite.write()
  failing = [name for name, job in suite.results["jobs"].items() if job_failed(job)]
  log(f"results: {suite.path}" + (f"; failed: {', '.join(failing)}" if failing else ""))
  return 1 if failing else 0


def define_flags() -> None:
  """The command's flags (defined when run as a command, not on import)."""
  flags.DEFINE_string("out", None, "Folder for results.json, log.txt, jobs/ and profile/.")
  flags.DEFINE_string("newstest_dir", None, "Folder with newstest2014.en and .de.")
  flags.DEFINE_bool("quick", False, "The small configs: the whole path in minutes on a CPU.")
  flags.DEFINE_string("flax_wmt_dir", None, "The Flax WMT example's folder, for the peers "
                      "job (an offline bundle carries it in peers/flax_wmt).")
  flags.DEFINE_string("workdir", None, "Also decode this trained run's test split (job "
                      "'trained').")
  flags.DEFINE_list("jobs", [], f"Jobs to run, of {', '.join(ORDER)} (always in that "
                    "order); default: all (trained only with --workdir).")
  flags.DEFINE_enum("attention", "auto", ["auto", *ATTENTION.names()], "The jobs' "
                    "model.attention_implementation (auto: cuDNN's where it fits).")
  flags.DEFINE_list("kernels", [], "This project's Pallas kernels the jobs use (default "
                    "none: XLA's fusions), of " +
                    ", ".join(f"{k} ({' '.join(v)})" for k, v in KERNEL_FLAGS.items()))
  flags.register_validator("kernels", lambda names: set(names) <= set(KERNEL_FLAGS),
                           f"each one of {', '.join(KERNEL_FLAGS)}")
  flags.DEFINE_float("job_budget_s", None, "Seconds each job may take (default, for one "
                     f"H100: {BUDGET_S}).")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
