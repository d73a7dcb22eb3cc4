r"""The accelerator measurement suite in one command (what an offline bundle's run.sh
runs): the paper's base and big in bfloat16 at 25k-token batches, beam-4 decoding of
the 3,003 newstest2014 sources, and a profile of a few base steps.

  python -m transformer_jax.benchmark_suite --out=DIR --newstest_dir=DIR \
      [--quick] [--workdir=TRAINED_RUN]

Each job is `python -m transformer_jax.benchmark ... --json` in its own process (a
clean device memory for each); their figures go to DIR/results.json, their logs to
DIR/log.txt, the base steps' trace to DIR/profile/ (TensorBoard's profile plugin or
ui.perfetto.dev read it) with its top operations in results.json. A job that fails
(say, out of memory) is recorded with its last log lines and the others still run.

Settings, each kept if already set in the environment:
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.95  JAX preallocates 95% of GPU memory (default
      75%), so that big's 25k-token step has room.
  JAX_COMPILATION_CACHE_DIR=DIR/../jax_cache  A second run skips compilation.
  XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true  Overlaps communication with
      compute (several GPUs); dropped, with a log line, if this XLA rejects it.
The jobs choose cuDNN attention where it fits (model.attention_implementation=auto),
dropout bits from the hardware generator (train.rng_impl=rbg) and a vocabulary padded to
a multiple of 128 (model.vocab_multiple): options, named in results.json.

--quick runs the same path with the small `numbers` configs in a few minutes on a CPU.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time

from absl import app, flags

FLAGS = flags.FLAGS
GPU_ENV = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.95",
           "XLA_FLAGS": "--xla_gpu_enable_latency_hiding_scheduler=true"}
OPTIONS = ["--config.model.dtype=bfloat16", "--config.model.attention_implementation=auto",
           "--config.train.rng_impl=rbg", "--config.model.vocab_multiple=128"]


def jobs(quick: bool, workdir: str | None) -> dict[str, list[str]]:
  """name -> benchmark flags."""
  config = lambda name: f"--config=configs/transformer.py:{name}"
  if quick:
    small = ["--pairs=5000", "--steps=10", "--repeats=1", "--config.decode.batch_size=32"]
    out = {"base": [config("numbers"), *OPTIONS, *small, "--decode_sentences=32"],
           "big": [config("numbers"), *OPTIONS, *small, "--config.model.d_model=256",
                   "--config.model.d_ff=1024", "--decode_sentences=0"]}
  else:
    out = {"base": [config("base"), *OPTIONS, "--decode_sentences=3003", "--repeats=1",
                    "--config.decode.batch_tokens=16384", "--config.decode.batch_size=1024"],
           "big": [config("big"), *OPTIONS, "--decode_sentences=0"]}
  out["base"].append(f"--profile_dir={os.path.join(FLAGS.out, 'profile')}")
  if workdir:
    out["trained"] = [f"--workdir={workdir}", "--split=test", "--repeats=1"]
  return out


def environment(out: str) -> dict[str, str]:
  env = dict(os.environ)
  env.setdefault("JAX_COMPILATION_CACHE_DIR",
                 os.path.join(os.path.dirname(os.path.abspath(out)), "jax_cache"))
  for key, value in GPU_ENV.items():
    env.setdefault(key, value)
  return env


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


def run_job(args: list[str], env: dict[str, str], log) -> dict:
  """One benchmark process: its stderr streamed to the log, its JSON returned."""
  start = time.time()
  command = [sys.executable, "-m", "transformer_jax.benchmark", *args, "--json"]
  log("$ " + " ".join(command[1:]))
  proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  tail = []
  for line in proc.stderr:
    log(line.rstrip("\n"))
    tail = (tail + [line.rstrip("\n")])[-20:]
  stdout = proc.stdout.read()
  code = proc.wait()
  if code:
    return {"error": f"exit {code}", "log_tail": tail, "seconds": time.time() - start}
  return {**json.loads(stdout), "command": " ".join(command[1:]),
          "seconds": time.time() - start}


def main(argv):
  del argv
  if not FLAGS.out:
    raise app.UsageError("--out=DIR is required.")
  os.makedirs(FLAGS.out, exist_ok=True)
  log_file = open(os.path.join(FLAGS.out, "log.txt"), "a")
  def log(line: str) -> None:
    print(line, flush=True)
    log_file.write(line + "\n")
    log_file.flush()
  env = check_xla_flags(environment(FLAGS.out), log)
  news = [f"--newstest_dir={FLAGS.newstest_dir}"] if FLAGS.newstest_dir else []
  results = {"started": datetime.datetime.now().isoformat(timespec="seconds"),
             "quick": FLAGS.quick, "command": " ".join(sys.argv),
             "environment": {k: env[k] for k in (*GPU_ENV, "JAX_COMPILATION_CACHE_DIR")
                             if k in env}, "jobs": {}}
  for name, args in jobs(FLAGS.quick, FLAGS.workdir).items():
    log(f"== {name}")
    results["jobs"][name] = run_job(args + (news if name != "trained" else []), env, log)
    with open(os.path.join(FLAGS.out, "results.json"), "w") as f:
      json.dump(results, f, indent=1)
  failed = [name for name, job in results["jobs"].items() if "error" in job]
  log(f"results: {os.path.join(FLAGS.out, 'results.json')}"
      + (f"; failed: {', '.join(failed)}" if failed else ""))
  return 1 if failed else 0


def define_flags() -> None:
  """The command's flags (defined when run as a command, not on import)."""
  flags.DEFINE_string("out", None, "Folder for results.json, log.txt and profile/.")
  flags.DEFINE_string("newstest_dir", None, "Folder with newstest2014.en and .de.")
  flags.DEFINE_bool("quick", False, "The small configs: the whole path in minutes on a CPU.")
  flags.DEFINE_string("workdir", None, "Also decode this trained run's test split.")


if __name__ == "__main__":
  define_flags()
  app.run(main)
