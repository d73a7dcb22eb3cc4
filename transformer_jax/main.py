"""Train and evaluate a Transformer.

  python -m transformer_jax.main --config=configs/transformer.py:numbers \
      --workdir=/tmp/numbers [--config.train.num_train_steps=3000 ...]

Re-running with the same --workdir resumes from its latest checkpoint.

Exit codes: 0 finished (results.json written); 2 bad input (config, flag or file; one
line on stderr, nothing in the workdir created or changed); 3 stopped on non-finite
loss or gradients (train.on_nonfinite); 75 stopped by SIGTERM/SIGINT or a preemption
notice after checkpointing the step in flight: run the same command to resume; 1 any
other failure.
"""

import logging
import re
import sys

import jax
from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from transformer_jax import config as config_lib, distributed, train

EXIT_INPUT, EXIT_NONFINITE, EXIT_PREEMPTED = 2, 3, 75

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file(
    "config", None, "Config file, optionally with an argument: configs/transformer.py:base. "
    "Override any field with --config.section.field=value.", lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, the tokenizer "
                    "and the resolved config. An existing run there is resumed.")
flags.DEFINE_string("coordinator_address", None, "host:port of process 0, for runs over "
                    "several processes (detected automatically on SLURM and TPU pods).")
flags.DEFINE_integer("num_processes", None, "Number of processes (with coordinator_address).")
flags.DEFINE_integer("process_id", None, "This process's index (with coordinator_address).")
flags.mark_flags_as_required(["config", "workdir"])


def _exit(code: int, message: str):
  print(f"error: {message}", file=sys.stderr)
  sys.exit(code)


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with every mistake (unknown or misspelt config field, missing
  config file, unknown config name, bad value) answered in one line, not a traceback."""
  try:
    rest = FLAGS(argv)
    list(FLAGS.config.keys())  # ml_collections reports a missing file lazily: ask now.
    return rest
  except Exception as e:  # absl and ml_collections raise several types for these.
    cause = e  # The first error in the chain that is not absl's wrapper says most.
    while isinstance(cause, flags.Error) and "Traceback" in str(cause) and (
        cause.__cause__ or cause.__context__) is not None:
      cause = cause.__cause__ or cause.__context__
    text = cause.args[0] if isinstance(cause, (KeyError, AttributeError)) and cause.args \
        else str(cause)
    text = str(text)
    if "Traceback (most recent call last)" in text:  # A config file's own error, as text.
      text = re.sub(r"^\w+(Error|Exception): ", "", text.strip().splitlines()[-1].strip())
    text = text.replace("\\n", " ").replace("\\", "").replace("'", "")
    _exit(EXIT_INPUT, " ".join(text.split()) or type(cause).__name__)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
  try:
    distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
  except ValueError as e:
    _exit(EXIT_INPUT, str(e))
  # Only process 0 narrates; the others report warnings and errors.
  logging.getLogger().setLevel(logging.INFO if jax.process_index() == 0 else logging.WARNING)
  # Orbax narrates every save at INFO; keep its warnings, drop the narration.
  absl_logging.get_absl_handler().addFilter(
      lambda r: r.levelno >= logging.WARNING or "/orbax/" not in r.pathname)
  try:
    train.train_and_evaluate(FLAGS.config, FLAGS.workdir)
  except config_lib.InputError as e:
    _exit(EXIT_INPUT, str(e))
  except train.NonFiniteError as e:
    _exit(EXIT_NONFINITE, str(e))
  except train.Preempted as e:
    print(f"stopped: {e}", file=sys.stderr)
    sys.exit(EXIT_PREEMPTED)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
