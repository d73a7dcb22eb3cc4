r"""Train and evaluate a Transformer.

  python -m transformer_jax.main --config=configs/transformer.py:numbers \
      --workdir=/tmp/numbers [--config.train.num_train_steps=3000 ...]

Re-running with the same --workdir resumes from its latest checkpoint. --print_config
prints the config that would run (every override applied and checked) and exits;
--prepare_data prepares the data and the tokenizer into --workdir and exits; a run of
several processes builds none of it, but reads what --prepare_data prepared (python -m
launch runs it first) or stops, exit 2, naming that command. Every config field, its
default and meaning: docs/config.md.

Exit codes (see cli.py): 0 finished (results.json written); 2 bad input; 3 stopped on
non-finite values; 74 no space left to checkpoint (free some, run it again to resume);
75 stopped by a signal after checkpointing (run it again to resume).
"""

import contextlib
import logging
import os
import shlex
import sys

import jax
from absl import flags
from etils import epath
from ml_collections import config_flags


from transformer_jax import checkpoint, cli, config as config_lib, distributed, files
from transformer_jax.data import tasks
from transformer_jax.training import loop, nonfinite, preemption, run_files, workdir_lock

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import)."""
  config_flags.DEFINE_config_file("config", None, "Config file, optionally with an "
                                  "argument: configs/transformer.py:base. Override any "
                                  "field with --config.section.field=value.",
                                  lock_config=True)
  flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, the tokenizer "
                      "and the resolved config. An existing run there is resumed.")
  flags.DEFINE_string("coordinator_address", None, "host:port of process 0, for runs over "
                      "several processes (detected automatically on SLURM and TPU pods).")
  flags.DEFINE_integer("num_processes", None, "Number of processes (with "
                       "coordinator_address).")
  flags.DEFINE_integer("process_id", None, "This process's index (with "
                       "coordinator_address).")
  flags.DEFINE_bool("print_config", False, "Print the resolved config (the file with "
                    "every --config override applied, then checked) as JSON and exit; no "
                    "--workdir needed.")
  flags.DEFINE_bool("prepare_data", False, "Prepare the data and stop: the TFDS dataset "
                    "(into data.tfds_data_dir), the tokenizer (WORKDIR/tokenizer.model) "
                    "and the tokenized training split (data.cache_dir, default "
                    "WORKDIR/tokenized). Once before a sweep whose runs then share them: "
                    "--set=data.tokenizer_file=WORKDIR/tokenizer.model "
                    "--set=data.cache_dir=...")
  flags.mark_flags_as_required(["config"])


def main():
  if FLAGS.print_config:
    try:
      config_lib.parse(FLAGS.config)
    except ValueError as e:
      cli.fail(str(e))
    print(FLAGS.config.to_json_best_effort(indent=2, sort_keys=True))
    return
  if not FLAGS.workdir:
    cli.fail("--workdir is required: the directory for this run's checkpoints and "
             "metrics (an existing run there is resumed).")
  if FLAGS.prepare_data:
    return _prepare_data(FLAGS.workdir)
  try:
    distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
    fingerprint = distributed.check_same_code()
  except ValueError as e:
    cli.fail(str(e))
  # Only process 0 narrates; the others report warnings and errors.
  logging.getLogger().setLevel(logging.INFO if jax.process_index() == 0 else logging.WARNING)
  logging.info("code %s from %s", fingerprint, os.path.dirname(os.path.dirname(__file__)))
  try:
    loop.train_and_evaluate(FLAGS.config, FLAGS.workdir)
  except config_lib.NotPrepared as e:  # Every process says it; the first line suffices.
    cli.fail(f"{e}: a run of {jax.process_count()} processes builds no data; prepare it "
             "once first, where every process reads it (python -m launch does, unless "
             f"told --prepare_data=false): {prepare_command(sys.argv)}")
  except config_lib.InputError as e:
    cli.fail(str(e))  # Nothing in the workdir was written.
  except workdir_lock.Lost as e:  # Another run writes the workdir now: no exit.json.
    cli.fail(str(e))
  except nonfinite.NonFiniteError as e:
    _record_exit(cli.EXIT_NONFINITE, str(e))
    cli.fail(str(e), cli.EXIT_NONFINITE)
  except checkpoint.DiskFull as e:
    _record_exit(cli.EXIT_DISK_FULL, str(e))
    print(f"error: {e}", file=sys.stderr, flush=True)
    os._exit(cli.EXIT_DISK_FULL)  # Orbax's writer threads would print their errors again.
  except preemption.Preempted as e:
    _record_exit(cli.EXIT_PREEMPTED, f"stopped: {e}")
    print(f"stopped: {e}", file=sys.stderr)
    sys.exit(cli.EXIT_PREEMPTED)
  except Exception as e:  # A full disk anywhere else (tokenizer, token cache, summaries)
    code = cli.EXIT_DISK_FULL if files.out_of_space(e) else 1  # is cli.run's one line.
    with contextlib.suppress(OSError):
      _record_exit(code, f"{type(e).__name__}: {e}".splitlines()[0])
    raise


def _prepare_data(workdir: str) -> None:
  """The data a run of this config reads, prepared once (process 0's part of a run)."""
  try:
    cfg = config_lib.parse(FLAGS.config)
    epath.Path(workdir).mkdir(parents=True, exist_ok=True)
    with run_files.sole_writer(workdir):
      task = tasks.load_task(cfg.data, workdir)
  except ValueError as e:
    cli.fail(str(e))
  print(f"prepared {cfg.data.task}: {len(task.train)} training pairs; tokenizer "
        f"{epath.Path(workdir) / 'tokenizer.model'} (vocabulary {task.tokenizer.vocab_size});"
        f" the tokenized training split under {tasks.cache_dir(cfg.data, workdir)}")


def prepare_command(argv: list[str]) -> str:
  """This run's command as the one that prepares its data: one process, --prepare_data."""
  distributed_flags = ("--coordinator_address", "--num_processes", "--process_id")
  args = [a for a in argv[1:] if not a.startswith(distributed_flags)]
  return shlex.join(["python", "-m", "transformer_jax.main", *args, "--prepare_data"])


def _record_exit(code: int, reason: str) -> None:
  if jax.process_index() == 0:
    run_files.record_exit(FLAGS.workdir, code, reason)


if __name__ == "__main__":
  define_flags()
  cli.run(main, stopped="before the next checkpoint: the workdir's checkpoints are kept; "
          "run the same command to resume.", outputs_end_stops=False)
