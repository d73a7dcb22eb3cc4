"""Where an experiment's trials run, chosen by --target: each target is a module of this
package (local.py, slurm.py, tpu.py) whose Target subclass registers itself under the
module's name, so a new one (a Kubernetes job, a Ray cluster) is one new module that
nothing else names (docs/extending.md).

The launcher (launch/__main__.py) does what is the same everywhere: it loads the
experiment, plans its trials (launch/trials.py) and checks every trial's config, then
hands them to the target. The rest is the target's: submitting each trial, watching
it, launching it again after a preemption or a time limit, collecting what it leaves,
and running a search's trials as its study draws them (launch/search.py).
"""

from __future__ import annotations

import os
from typing import Sequence

from launch import pack as pack_lib, sweep, trials as trials_lib
from transformer_jax import cli, files
from transformer_jax.planning import cost, topology
from transformer_jax.registry import Registry

TARGETS = Registry("launch target", "launch.targets")


class Target:
  """One place trials run, built from the command's parsed flags (`flags`: the
  launcher's own, --root, --dry_run, --smoke..., and every target's)."""

  # A search's study by default: SQLite in the experiment's folder, or (True) a journal
  # file there, for trials on many machines that append to it over a network filesystem
  # (where SQLite's locks do not hold).
  study_journal = False

  def __init__(self, flags):
    self.flags = flags

  @staticmethod
  def define_flags() -> None:
    """Defines the target's own flags, named for it (--nodes, --tpu_name). The launcher
    defines every target's before it parses the command line: --help lists them all."""

  def hosts(self) -> int:
    """How many machines train each trial (more than one: they read shared data)."""
    return 1

  def processes(self) -> int:
    """How many processes train each trial."""
    return 1

  def launch(self, experiment: sweep.Experiment, runs: Sequence[trials_lib.Run]) -> int:
    """Runs an experiment's listed trials (finished ones skipped, unfinished ones
    resumed) or, with --dry_run, prints what it would run; returns the exit code."""
    raise NotImplementedError

  def check_search(self) -> None:
    """Refuses, in one line, flags this target cannot run a search with; called before
    the search's study is opened."""

  def search(self, experiment: sweep.Experiment, extra: Sequence[tuple[str, str]],
             storage: str) -> int:
    """Runs a search's trials as its study (in `storage`) draws them, each with the
    `extra` (path, value) overrides; returns the exit code."""
    raise NotImplementedError

  def prepare(self) -> bool:
    """Whether each trial's data is prepared once, in one process, before the processes
    that train it start (--prepare_data, for a trial of several)."""
    return self.flags.prepare_data and self.processes() > 1

  def offline(self) -> bool:
    """A dry run with a bucket for --root reads nothing from it."""
    return self.flags.dry_run and files.is_remote(self.flags.root)

  def shipped_code(self, tool: str) -> pack_lib.Pack | None:
    """The working tree packed to ship to the machines (None with --noship), after the
    checks of --ship and --repo_dir, and of `tool` on PATH (unless a dry run)."""
    flags = self.flags
    if flags.repo_dir and flags.ship:
      cli.fail(f"--repo_dir={flags.repo_dir} conflicts with shipping the code: the launcher "
               "ships this working tree and runs it from a directory named by its "
               "fingerprint. Drop --repo_dir, or add --noship to run the code at it.")
    if not flags.dry_run:
      trials_lib.require(tool, flags.target)
    if not flags.ship and not flags.repo_dir:
      cli.fail("--noship needs --repo_dir: where the code is on every machine.")
    try:
      return pack_lib.make(os.getcwd()) if flags.ship else None
    except pack_lib.PackError as e:
      cli.fail(str(e))

  def code_record(self, code: pack_lib.Pack | None) -> dict:
    """What each trial records of the code it runs: the shipped pack's fingerprint, or
    --repo_dir's checkout with --noship."""
    return code.record() if code else {"repo_dir": self.flags.repo_dir}

  def search_code(self) -> str | None:
    """The fingerprint of the code a search's trials run (its study stores it, and
    refuses other code): this working tree's, shipped; with --noship, --repo_dir's where
    it is on this machine, else None (not compared)."""
    directory = os.getcwd() if self.flags.ship else self.flags.repo_dir
    return pack_lib.fingerprint(directory) if directory and os.path.isdir(directory) \
        else None

  def unfinished(self, runs: Sequence[trials_lib.Run]) -> list[trials_lib.Run]:
    """The trials to start: every one in an offline dry run (nothing is read), else those
    without results.json; one line says when none is left."""
    todo = list(runs) if self.offline() else [r for r in runs if not trials_lib.finished(r)]
    if not todo:
      print("# every trial is finished")
    return todo

  def check_shipped(self, runs: Sequence[trials_lib.Run], code: pack_lib.Pack | None
                    ) -> None:
    """Refuses to resume `runs` launched with other code, then describes `code`."""
    if self.offline():
      print(f"# dry run: {self.flags.root} is not read (no network needed): every trial is "
            "shown, finished or not, and its recorded code is not compared")
    elif code:
      trials_lib.check_code(runs, code.fingerprint, self.flags.allow_code_change)
    if code:
      print(f"# code {code.fingerprint}: {len(code.files)} files, {len(code.data) / 1e3:.0f} "
            f"kB, revision {code.revision[:12]}{' + local changes' * bool(code.diff)}")

  def print_costs(self, runs: Sequence[trials_lib.Run], accelerators: str | None,
                  compiled: dict | None = None) -> None:
    """Each trial's cost on `accelerators` (planning/cost.py), from a fit check's
    compiled figures where given; nothing for None."""
    if accelerators is None:
      return
    try:
      target = topology.parse(accelerators)
    except ValueError as e:
      if self.flags.cost_on:
        cli.fail(f"--cost_on={accelerators}: {e}")
      print(f"# cost: not estimated: {e} --cost_on names the accelerators to estimate it on")
      return
    for run in runs:
      cfg, _ = trials_lib.parse(run)
      parts = cost.parts(cfg, target, cost.parameter_count(cfg), compiled,
                         self.flags.checkpoint_mb_per_s)
      print("\n".join(cost.describe(run.trial.name, target, parts)), flush=True)
