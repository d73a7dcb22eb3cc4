r"""Launch an experiment's trials: locally, on a SLURM GPU cluster, or on Cloud TPUs.

  python -m launch --experiment=experiments/multi30k_lr_warmup.py --target=local
  python -m launch --experiment=experiments/table3.py --target=slurm --nodes=1 \
      --gpus_per_node=8 --root=/shared/runs --activate='source ~/venv/bin/activate'
  python -m launch --experiment=experiments/big_reproduction.py --target=tpu \
      --tpu_name=big --zone=us-east5-a --accelerator_type=v5p-64 --spot \
      --root=gs://bucket/runs

Each trial runs in ROOT/EXPERIMENT/TRIAL; launching again skips finished trials and
resumes unfinished ones. The code that runs on a cluster or TPU is this working tree,
shipped there (uncommitted changes included) and recorded in each trial's trial.json.
With --accelerator_type the launcher creates a TPU per trial, recreates it after a
preemption and deletes it when the trial has its results.json; it watches until every
trial is done (Ctrl-C stops the watching only). --dry_run prints what would be run, and
each trial's cost in hours and device-hours, part by part (planning/cost.py).
Compare the trials afterwards with `python -m launch.results`.
"""

import json
import os
import shlex
import subprocess
import sys
import time

import jax
from absl import flags

from launch import (launcher, pack as pack_lib, search as search_lib, study as study_lib, sweep,
                    tpu, warm_start)
from transformer_jax import cli, files
from transformer_jax.planning import cost, topology

FLAGS = flags.FLAGS


TPU_POLL_S = 60.0  # Seconds between looks at each TPU.


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import)."""
  flags.DEFINE_string("experiment", None, "Experiment file, e.g. experiments/table3.py.",
                      required=True)
  flags.DEFINE_enum("target", "local", ["local", "slurm", "tpu"], "Where the trials run.")
  flags.DEFINE_string("root", "runs", "Directory (or gs:// bucket) that holds the "
                      "workdirs.")
  flags.DEFINE_bool("dry_run", False, "Print what would be run or submitted; run nothing.")
  flags.DEFINE_multi_string("set", [], "PATH=VALUE config override for every trial, e.g. "
                            "--set=data.manual_dir=/data/multi30k.")
  flags.DEFINE_multi_string("trials", [], "Only this trial (by name); repeatable.")
  flags.DEFINE_string("storage", None, "A search's study (experiments that define SEARCH): "
                      "an SQLAlchemy URL (sqlite:///PATH, postgresql://USER@HOST/DB) or "
                      "journal:PATH (a file on a shared filesystem); default: "
                      f"${study_lib.STORAGE_ENV} (where a URL with a password belongs), "
                      "else where the search was launched before, else SQLite in "
                      "ROOT/EXPERIMENT/study.db (slurm: a journal there).")
  flags.DEFINE_multi_string("warm_start", [], "A search starts from the finished trials "
                            "of this experiment file (a grid, or an earlier search) under "
                            "the same --root, added to its study with their values once; "
                            "repeatable.")
  flags.DEFINE_bool("allow_search_change", False, "Go on with a study created with "
                    "another SEARCH (space, metric, sampler, pruner or seed), storing the "
                    "new one in it.")
  flags.DEFINE_bool("smoke", False, "Use the config's ',smoke' variant: a tiny quick "
                    "check.")
  flags.DEFINE_integer("processes", 1, "local: processes per trial (multi-process runs).")
  flags.DEFINE_bool("prepare_data", True, "A trial of several processes has its data "
                    "(TFDS's dataset, the tokenizer, the tokenized training split) "
                    "prepared once, in one process, before its processes start: they "
                    "build nothing. --prepare_data=false: it was prepared beforehand "
                    "(python -m transformer_jax.main ... --prepare_data).")
  flags.DEFINE_integer("nodes", 1, "slurm: nodes per trial.")
  flags.DEFINE_integer("gpus_per_node", 8, "slurm: GPUs per node (one process each).")
  flags.DEFINE_string("partition", None, "slurm: partition.")
  flags.DEFINE_string("time", None, "slurm: time limit, e.g. 48:00:00.")
  flags.DEFINE_string("account", None, "slurm: the account to charge.")
  flags.DEFINE_string("qos", None, "slurm: quality of service.")
  flags.DEFINE_string("mem", None, "slurm: memory per node, e.g. 400G (0: all of it).")
  flags.DEFINE_integer("cpus_per_task", None, "slurm: CPU cores per task (per GPU).")
  flags.DEFINE_multi_string("sbatch", [], "slurm: any other sbatch option, as it follows "
                            "#SBATCH, e.g. --sbatch=--exclusive; repeatable.")
  flags.DEFINE_integer("max_running", 0, "slurm: at most this many trials at once (the "
                       "array's %N throttle); 0: as many as SLURM allows.")
  flags.DEFINE_string("slurm_bin", None, "slurm: a folder of SLURM's commands (sbatch, "
                      "srun, scontrol) to use before those on PATH; launch/slurm_standin "
                      "is a stand-in that runs the job on this machine, its nodes "
                      "simulated (a rehearsal: docs/paper.md).")
  flags.DEFINE_string("activate", None, "slurm: shell line that activates the Python "
                      "environment on the nodes, e.g. 'source ~/venv/bin/activate'.")
  flags.DEFINE_bool("ship", True, "slurm/tpu: ship this working tree and run it there. "
                    "--noship runs the code already at --repo_dir on every machine.")
  flags.DEFINE_string("repo_dir", None, "slurm/tpu with --noship: the repository's path "
                      "on every machine.")
  flags.DEFINE_bool("allow_code_change", False, "Resume trials launched with other code.")
  flags.DEFINE_string("tpu_name", None, "tpu: the TPU VM's name; with --accelerator_type "
                      "the prefix of the TPUs created, NAME-0, NAME-1, ... (one per "
                      "trial).")
  flags.DEFINE_string("zone", None, "tpu: its zone.")
  flags.DEFINE_string("project", None, "tpu: its Google Cloud project (default: "
                      "gcloud's).")
  flags.DEFINE_string("accelerator_type", None, "tpu: create a TPU of this type per trial "
                      "(v5p-64, v6e-256, ...), keep it running until the trial is done, "
                      "then delete it.")
  flags.DEFINE_string("runtime_version", "tpu-ubuntu2204-base", "tpu: TPU VM software.")
  flags.DEFINE_bool("spot", False, "tpu: create spot (preemptible) TPUs.")
  flags.DEFINE_bool("queued_resource", False, "tpu: create them as queued resources.")
  flags.DEFINE_integer("parallel", 1, "tpu: trials running at once, each on its own TPU.")
  flags.DEFINE_integer("max_failures", 5, "tpu: give a trial up after this many gcloud "
                       "failures in a row.")
  flags.DEFINE_float("poll_s", None, "Seconds between looks: tpu, at each TPU (default "
                    f"{TPU_POLL_S:g}); a search here, at its trial's new evaluations "
                    f"(default {search_lib.POLL_S:g}).")
  flags.DEFINE_string("cost_on", None, "--dry_run: print each trial's cost on these "
                      "accelerators, as benchmark --topology names them (8xH100, 16xH200, "
                      "v5p-64); default: local, this machine's own GPUs; slurm, NODES x "
                      "GPUS_PER_NODE H100s; tpu, --accelerator_type.")
  flags.DEFINE_float("checkpoint_mb_per_s", 200.0, "The cost's checkpoint writes at this "
                     "bandwidth to --root, MB/s.")
  flags.DEFINE_bool("skip_fit_check", False, "tpu: create the TPUs without first "
                    "compiling each trial's train step for --accelerator_type here "
                    "(libtpu) to see that it fits.")

def main():
  experiment = sweep.load_experiment_or_exit(FLAGS.experiment)
  if FLAGS.slurm_bin:  # For sbatch, and for the job it submits (its PATH is this one).
    if not os.path.isdir(FLAGS.slurm_bin):
      cli.fail(f"--slurm_bin={FLAGS.slurm_bin}: no such folder (one that holds sbatch, "
               "srun and scontrol).")
    os.environ["PATH"] = os.path.abspath(FLAGS.slurm_bin) + os.pathsep + os.environ["PATH"]
  extra = []
  for item in FLAGS.set:
    if "=" not in item:
      cli.fail(f"--set={item!r}: expected PATH=VALUE.")
    extra.append(tuple(item.split("=", 1)))
  if experiment.search is not None:
    sys.exit(_search(experiment, extra))
  runs = launcher.plan(experiment, FLAGS.root, extra, FLAGS.smoke)
  if FLAGS.trials:
    unknown = sorted(set(FLAGS.trials) - {r.trial.name for r in runs})
    if unknown:
      cli.fail(f"--trials: unknown trials {unknown}; this experiment has "
                       f"{[r.trial.name for r in runs]}.")
    runs = [r for r in runs if r.trial.name in FLAGS.trials]
  launcher.check_overrides(runs)
  if _hosts() > 1:  # One machine's processes share its home, and TFDS's folder there.
    runs = launcher.shared_data(runs, FLAGS.root)
  print(f"# {experiment.name}: {len(runs)} trials, target {FLAGS.target}")
  if FLAGS.target == "local":
    code = pack_lib.describe(os.getcwd())
    launcher.check_code(runs, code["fingerprint"], FLAGS.allow_code_change)
    failed = launcher.launch_local(experiment, runs, FLAGS.processes, FLAGS.dry_run,
                                   code, FLAGS.prepare_data)
    if FLAGS.dry_run:
      _print_costs(runs, FLAGS.cost_on or _own_accelerators())
    sys.exit(1 if failed else 0)
  code = _code()
  if _offline():
    print(f"# dry run: {FLAGS.root} is not read (no network needed): every trial is shown, "
          "finished or not, and its recorded code is not compared")
  elif code:
    launcher.check_code(runs, code.fingerprint, FLAGS.allow_code_change)
  if code:
    print(f"# code {code.fingerprint}: {len(code.files)} files, {len(code.data) / 1e3:.0f} kB, "
          f"revision {code.revision[:12]}{' + local changes' * bool(code.diff)}")
  if FLAGS.target == "slurm":
    print(launcher.launch_slurm(
        experiment, runs, FLAGS.dry_run, code, FLAGS.root, nodes=FLAGS.nodes,
        gpus_per_node=FLAGS.gpus_per_node, activate=FLAGS.activate,
        repo_dir=FLAGS.repo_dir, sbatch=_sbatch_options(), max_running=FLAGS.max_running,
        prepare=_prepare()))
    if FLAGS.dry_run:
      _print_costs(runs, FLAGS.cost_on or f"{FLAGS.nodes * FLAGS.gpus_per_node}xH100")
    return
  if not FLAGS.tpu_name or not FLAGS.zone:
    cli.fail("--target=tpu needs --tpu_name and --zone.")
  sys.exit(_launch_tpu(experiment, runs, code))


def _code():
  """The working tree packed to ship to a cluster or TPU (None with --noship), after the
  checks of --ship, --repo_dir and the target's tool."""
  if FLAGS.repo_dir and FLAGS.ship:
    cli.fail(f"--repo_dir={FLAGS.repo_dir} conflicts with shipping the code: the launcher "
             "ships this working tree and runs it from a directory named by its "
             "fingerprint. Drop --repo_dir, or add --noship to run the code at it.")
  if not FLAGS.dry_run:
    launcher.require("sbatch" if FLAGS.target == "slurm" else "gcloud", FLAGS.target)
  if not FLAGS.ship and not FLAGS.repo_dir:
    cli.fail("--noship needs --repo_dir: where the code is on every machine.")
  try:
    return pack_lib.make(os.getcwd()) if FLAGS.ship else None
  except pack_lib.PackError as e:
    cli.fail(str(e))


def _search(experiment, extra) -> int:
  """An experiment that defines SEARCH: checked, then run here."""
  if FLAGS.trials:
    cli.fail("--trials picks among an experiment's listed trials; a search draws its "
             "trials as it goes")
  if FLAGS.target == "tpu" and not (FLAGS.tpu_name and FLAGS.zone and
                                    FLAGS.accelerator_type):
    cli.fail("--target=tpu: a search needs --tpu_name, --zone and --accelerator_type: "
             "it creates a TPU for each trial it draws, and deletes it after")
  if files.is_remote(FLAGS.root) and not (FLAGS.storage or
                                          os.environ.get(study_lib.STORAGE_ENV)):
    cli.fail(f"--root={FLAGS.root}: a bucket holds no SQLite study or journal; give "
             "--storage: a database URL, or a file on the launcher's machine, e.g. "
             f"--storage=sqlite:///$HOME/studies/{experiment.name}.db")
  search_lib.check(experiment, FLAGS.root, extra, FLAGS.smoke)
  storage = study_lib.resolve_storage(experiment, FLAGS.root, FLAGS.smoke, FLAGS.storage,
                                       FLAGS.target)
  if FLAGS.target == "slurm":
    _slurm_search_checks()
  warm_start.prepare(experiment, storage, FLAGS.root, extra, FLAGS.smoke, FLAGS.warm_start,
                     FLAGS.dry_run, FLAGS.allow_search_change)
  if FLAGS.target == "local":
    code = pack_lib.describe(os.getcwd())
    return 1 if search_lib.launch_local(experiment, FLAGS.root, storage, extra,
                                        FLAGS.smoke, FLAGS.processes, FLAGS.dry_run,
                                        code, FLAGS.poll_s or search_lib.POLL_S) else 0
  if FLAGS.target == "tpu":
    return _search_tpu(experiment, extra, storage)
  code = _code()
  print(search_lib.launch_slurm(
      experiment, os.path.abspath(FLAGS.root), storage, extra, FLAGS.smoke, FLAGS.dry_run,
      code, FLAGS.repo_dir, gpus_per_node=FLAGS.gpus_per_node, activate=FLAGS.activate,
      sbatch=_sbatch_options(), max_running=FLAGS.max_running))
  return 0


def _slurm_search_checks() -> None:
  if FLAGS.nodes != 1:
    cli.fail(f"--nodes={FLAGS.nodes}: a search's SLURM tasks train each trial on one node")
  if files.is_remote(FLAGS.root):
    cli.fail(f"--root={FLAGS.root}: SLURM runs need a shared filesystem path that every "
             "node mounts, not a bucket.")


def _search_tpu(experiment, extra, storage) -> int:
  """A search on TPUs: the space's two ends checked to fit first (as listed trials are),
  then the launcher holds the study and runs each trial on a TPU of its own."""
  _check_tpu_root()
  code = _code()
  if not FLAGS.dry_run:
    tpu.preflight(tpu.Tpu(FLAGS.tpu_name, **_tpu_settings()))
  if not FLAGS.skip_fit_check:
    _fit_check(search_lib.corner_runs(experiment, FLAGS.root, extra, FLAGS.smoke),
               FLAGS.accelerator_type)
  return search_lib.launch_tpu(
      experiment, FLAGS.root, storage, extra, FLAGS.smoke, FLAGS.dry_run, code,
      FLAGS.repo_dir, FLAGS.tpu_name, _tpu_settings(), parallel=FLAGS.parallel,
      max_failures=FLAGS.max_failures, poll_s=FLAGS.poll_s or TPU_POLL_S)


def _processes() -> int:
  """How many processes train each trial: the SLURM tasks, a TPU's hosts (several when
  its type is not given or not known here), or --processes."""
  if FLAGS.target == "slurm":
    return FLAGS.nodes * FLAGS.gpus_per_node
  if FLAGS.target == "tpu":
    return tpu.hosts(FLAGS.accelerator_type)
  return FLAGS.processes


def _hosts() -> int:
  """How many machines train each trial: SLURM's nodes, a TPU's hosts, or this one."""
  if FLAGS.target == "slurm":
    return FLAGS.nodes
  return tpu.hosts(FLAGS.accelerator_type) if FLAGS.target == "tpu" else 1


def _prepare() -> bool:
  """Whether each trial's data is prepared once before its processes start."""
  return FLAGS.prepare_data and _processes() > 1


def _tpu_settings() -> dict:
  return dict(zone=FLAGS.zone, project=FLAGS.project, accelerator_type=FLAGS.accelerator_type,
              runtime_version=FLAGS.runtime_version, spot=FLAGS.spot,
              queued=FLAGS.queued_resource)


def _offline() -> bool:
  """A dry run with a bucket for --root reads nothing from it."""
  return FLAGS.dry_run and files.is_remote(FLAGS.root)


def _sbatch_options() -> list[str]:
  named = {"partition": FLAGS.partition, "time": FLAGS.time, "account": FLAGS.account,
           "qos": FLAGS.qos, "mem": FLAGS.mem, "cpus-per-task": FLAGS.cpus_per_task}
  return [f"--{k}={v}" for k, v in named.items() if v is not None] + FLAGS.sbatch


def _check_tpu_root() -> None:
  """A slice of several hosts needs a bucket for --root: a local one is refused."""
  if FLAGS.accelerator_type and not files.is_remote(FLAGS.root):
    try:
      hosts = topology.parse_tpu(FLAGS.accelerator_type).hosts
    except ValueError:  # A type this code does not know: gcloud's check names it.
      hosts = 1
    if hosts > 1:
      cli.fail(f"--root={FLAGS.root} is a local directory, but a {FLAGS.accelerator_type} "
               f"has {hosts} hosts: each would write its own checkpoints, and this launcher "
               "could not see them; give a bucket every host reads, --root=gs://BUCKET/runs.")


def _launch_tpu(experiment, runs, code) -> int:
  _check_tpu_root()
  settings = _tpu_settings()
  todo = runs if _offline() else [r for r in runs if not launcher.finished(r)]
  if not todo:
    print("# every trial is finished")
    return 0
  pack_dir = tpu.PACKS  # Local: gcloud's scp copies from here.
  record = code.record() if code else {"repo_dir": FLAGS.repo_dir}
  if not FLAGS.accelerator_type:
    for run in todo if not FLAGS.dry_run else []:
      launcher.record(run, experiment, record)
    if FLAGS.dry_run and FLAGS.cost_on:
      _print_costs(todo, FLAGS.cost_on)
    return tpu.launch(todo, tpu.Tpu(FLAGS.tpu_name, **settings), code, FLAGS.dry_run,
                      pack_dir, FLAGS.repo_dir, _prepare())
  index = {t.name: i for i, t in enumerate(experiment.trials)}
  tpus = [tpu.Tpu(f"{FLAGS.tpu_name}-{index[r.trial.name]}", **settings) for r in todo]
  if not FLAGS.dry_run:
    tpu.preflight(tpus[0])  # gcloud's account and the zone's types: quick, so first.
  if not FLAGS.skip_fit_check:
    _fit_check(todo, FLAGS.accelerator_type)
  elif FLAGS.dry_run:
    _print_costs(todo, FLAGS.cost_on or FLAGS.accelerator_type)
  for run, machine in zip(todo, tpus):
    print(f"# {run.trial.name} on {machine.name}:")
    for command in (machine.create(), *tpu.start_commands(
        machine, [run], code, pack_dir, FLAGS.repo_dir, _prepare()), machine.delete()):
      print(shlex.join(command))
  if FLAGS.dry_run:
    return 0
  for run in todo:
    launcher.record(run, experiment, record)
  log = tpu.log_to(launcher.experiment_dir(experiment, FLAGS.root, FLAGS.smoke) /
                   "tpu_events.log")
  return tpu.keep_alive(todo, tpus, code, pack_dir, FLAGS.repo_dir, parallel=FLAGS.parallel,
                        max_failures=FLAGS.max_failures, poll_s=FLAGS.poll_s or TPU_POLL_S, log=log,
                        prepare=_prepare())


def _fit_check(runs, accelerator_type: str) -> None:
  """Compiles each trial's train step for `accelerator_type` on this machine (libtpu's
  compile-only devices), before any TPU exists; refuses, in one line, a trial that would
  not fit, naming what would."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  print(f"# checking that each trial fits {accelerator_type}: its train step, eval step "
        "and beam search compiled here with libtpu (minutes a trial for base and big; "
        "--skip_fit_check skips it)", flush=True)
  for run in runs:
    args = [a for a in run.args if not a.startswith("--workdir=")]
    print(f"# {run.trial.name}: compiling for {accelerator_type} ...", flush=True)
    start = time.time()
    out = subprocess.run([sys.executable, "-m", "transformer_jax.benchmark", *args,
                          f"--topology={accelerator_type}", "--json"],
                         capture_output=True, text=True, env=env)
    if out.returncode:
      lines = out.stderr.strip().splitlines() or ["(no output)"]
      cli.fail(f"{run.trial.name}: {lines[-1].removeprefix('error: ')} (checked here "
               "with libtpu; --skip_fit_check creates the TPU anyway)")
    f = json.loads(out.stdout)
    print(f"# {run.trial.name}: fits {accelerator_type}, {f['total_gib']:.2f} of "
          f"{f['hbm_gib']:.0f} GiB a chip, mesh {f['mesh']}; estimated ({f['estimate']}) "
          f"{f['estimated_step_s'] * 1e3:.1f} ms a step (checked in "
          f"{time.time() - start:.0f} s)", flush=True)
    _print_costs([run], accelerator_type, f)


def _own_accelerators() -> str | None:
  """This machine's GPUs as benchmark --topology names them (8xH100), or None."""
  devices = jax.devices()
  for model, (kind, *_) in topology.GPUS.items():
    if devices[0].device_kind == kind:
      return f"{len(devices)}x{model}"
  print(f"# cost: not estimated for this machine's {len(devices)} {devices[0].device_kind} "
        "device(s); --cost_on=8xH100 (or 16xH200, v5p-64...) estimates it there")
  return None


def _print_costs(runs, accelerators: str | None, compiled: dict | None = None) -> None:
  """Each trial's cost on `accelerators` (planning/cost.py), from the fit check's
  compiled figures where given."""
  if accelerators is None:
    return
  try:
    target = topology.parse(accelerators)
  except ValueError as e:
    if FLAGS.cost_on:
      cli.fail(f"--cost_on={accelerators}: {e}")
    print(f"# cost: not estimated: {e} --cost_on names the accelerators to estimate it on")
    return
  for run in runs:
    cfg, _ = launcher.parse(run)
    parts = cost.parts(cfg, target, cost.parameter_count(cfg), compiled,
                       FLAGS.checkpoint_mb_per_s)
    print("\n".join(cost.describe(run.trial.name, target, parts)), flush=True)


if __name__ == "__main__":
  define_flags()
  cli.run(main)
