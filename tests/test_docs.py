"""Every command in README.md and docs/*.md runs as written. Those on --workdir=/tmp/run
run against a smoke run made by the documented training command; launches run as dry
runs; the rest, which need a download, an accelerator or hours, have their flags parsed
and their configs resolved (main --print_config)."""

import glob
import itertools
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT, run_commands, run_forked, xla_flags

DOCS = [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]


def documented_commands() -> list[tuple[str, str]]:
  """(file, command) for each `python -m` command in the docs' bash blocks, in their
  order, each command once (with the first file that shows it); lines continued with a
  backslash are joined; fragments with `...` are left out, and so is docs/extending.md,
  whose commands use the modules it adds (tests/test_extending.py runs them)."""
  found, seen = [], set()
  for path in [p for p in DOCS if os.path.basename(p) != "extending.md"]:
    text = open(path, encoding="utf-8").read()
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
      for line in block.replace("\\\n", " ").splitlines():
        line = line.split(" # ")[0].split("&&")[-1].strip()  # After `pip install &&`.
        if "python -m " in line and not line.startswith("#") and "..." not in line \
            and "pytest" not in line:  # The test command runs these tests.
          command = re.sub(r"\s+", " ", line)
          if command not in seen:
            seen.add(command)
            found.append((os.path.relpath(path, ROOT), command))
  return found


COMMANDS = documented_commands()


def _module_and_args(command: str) -> tuple[str, list[str]]:
  words = shlex.split(command.split("|")[-1].split("<")[0])
  words = words[words.index("-m") + 1:]
  return words[0], words[1:]


def _on_a_run(command: str) -> bool:
  """Run by the workflow test, on the smoke run it trains."""
  return "/tmp/run" in command


def _dry_run(command: str) -> bool:
  """Run by the dry-run test: launches, their results, and configs main resolves."""
  module = _module_and_args(command)[0]
  return module in ("launch", "launch.results") or (
      module == "transformer_jax.main" and not _on_a_run(command))


def _anchor(heading: str) -> str:
  """GitHub's anchor for a Markdown heading: lowercase, punctuation dropped, spaces to
  hyphens."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_between_the_docs_reaches_a_file_and_a_heading():
  """A renamed section or file breaks no link: each relative `[text](file#anchor)` in
  README.md and docs/*.md names a file that exists and, if it has one, an anchor made
  from one of that file's headings."""
  broken = []
  for path in DOCS:
    text = open(path, encoding="utf-8").read()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
      if re.match(r"[a-z]+://", target):
        continue
      name, _, anchor = target.partition("#")
      linked = os.path.normpath(os.path.join(os.path.dirname(path), name)) if name else path
      if not os.path.exists(linked):
        broken.append(f"{os.path.relpath(path, ROOT)}: {target} (no such file)")
      elif anchor:
        headings = re.findall(r"^#+ (.+)$", open(linked, encoding="utf-8").read(), re.M)
        if anchor not in {_anchor(h) for h in headings}:
          broken.append(f"{os.path.relpath(path, ROOT)}: {target} (no such heading)")
  assert not broken, broken


def test_every_test_that_docs_paper_md_names_exists_where_it_says():
  """docs/paper.md's last column names, for each detail of the paper, the tests that pin
  it (file, then test names): each is defined in that file."""
  with open(os.path.join(ROOT, "docs", "paper.md"), encoding="utf-8") as f:
    rows = [line for line in f.read().splitlines() if line.startswith("| ")][1:]
  named = 0
  for row in rows:
    for place in row.rstrip(" |").split("|")[-1].split(";"):
      path, names = place.strip().split(": ", 1)
      with open(os.path.join(ROOT, "tests", path), encoding="utf-8") as f:
        code = f.read()
      for name in re.findall(r"`(test_\w+)`", names):
        assert f"def {name}(" in code, (path, name)
        named += 1
  assert named >= len(rows), (named, len(rows))


def test_the_docs_show_commands_of_every_kind():
  modules = {_module_and_args(c)[0] for _, c in COMMANDS}
  assert {"transformer_jax.main", "transformer_jax.translate", "transformer_jax.evaluate",
          "transformer_jax.score", "transformer_jax.export", "transformer_jax.benchmark",
          "launch", "launch.results"} <= modules, modules


@pytest.mark.slow
def test_every_documented_command_has_valid_flags(tmp_path):
  """The commands that no test below runs (they need a download, an accelerator or
  hours) parse their flags: each runs with absl's --only_check_args (which exits once
  the flags parsed), forked from one process (conftest.run_forked)."""
  commands = sorted(c for _, c in COMMANDS if not (_on_a_run(c) or _dry_run(c)))
  cases = [(f"{module}.__main__" if module == "launch" else module,
            [*args, "--only_check_args"], None)
           for module, args in map(_module_and_args, commands)]
  results = run_forked(cases, tmp_path, devices=1)
  errors = [f"{command}: {err[-1000:]}" for command, (code, _, err)
            in zip(commands, results, strict=True) if code != 0]  # --help: 0
  assert not errors, "\n".join(errors)


def _moved_here(command: str, tmp_path) -> str:
  """The command with its files (/tmp/run, src.txt, ...) in tmp_path."""
  command = command.replace("/tmp/run", f"{tmp_path}/run")
  for name in ("src.txt", "hyp.txt", "ref.txt", "/tmp/results.csv", "/tmp/curves.png"):
    command = command.replace(name, f"{tmp_path}/{os.path.basename(name)}")
  return command


def _run(command: str, tmp_path, timeout=600) -> subprocess.CompletedProcess:
  command = _moved_here(command, tmp_path)
  env = {**os.environ, "XLA_FLAGS": xla_flags(1),
         "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}  # `python`
  return subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True,
                        timeout=timeout, env=env)


DRY_RUNS = [(f, c) for f, c in COMMANDS if _dry_run(c)]


def _as_dry_run(command: str, tmp_path) -> str:
  """A documented command as the dry-run test runs it: a launch as a dry run, its
  --root moved here; main printing its config; results without curves."""
  module, _ = _module_and_args(command)
  command = re.sub(r"--root=\S+", f"--root={tmp_path}/runs", command)
  # A local root: a single-host slice (a multi-host one needs a gs:// root).
  command = re.sub(r"--accelerator_type=v5p-\d+", "--accelerator_type=v5p-8", command)
  if module == "launch" and "--dry_run" not in command:
    command += " --dry_run"
  if "--accelerator_type" in command:  # Compiling big for a pod takes minutes here;
    command += " --skip_fit_check"  # tests/planning/test_topology.py checks it.
  if module == "transformer_jax.main" and "--print_config" not in command:
    command += " --print_config"
  if module == "launch.results":
    command = re.sub(r" --plot=\S+", "", command)  # No curves before any trial ran.
  return command


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory) -> dict[str, tuple[int, str, str]]:
  """Each of DRY_RUNS run in a folder of its own: {command: (exit code, stderr, the
  command as run)}. Plain `python -m MODULE ARGS` commands (all of them today) run
  forked from one process per module that imported it (conftest.run_commands: about
  2 s of start-up each, 30 times, saved); any other runs in bash."""
  tmp, found, plain = tmp_path_factory.mktemp("dry_runs"), {}, {}
  for i, (_, command) in enumerate(DRY_RUNS):
    folder = tmp / str(i)
    folder.mkdir()
    run = _as_dry_run(command, folder)
    if run.startswith("python -m ") and not set(run) & set("|<>;$`&"):
      module, args = _module_and_args(_moved_here(run, folder))
      plain.setdefault(module, []).append((command, run, args))
    else:
      out = _run(run, folder)  # Moves its files here too.
      found[command] = (out.returncode, out.stderr, run)
  for module, cases in plain.items():
    (tmp / module).mkdir()
    results = run_commands([args for _, _, args in cases], tmp / module,
                           f"{module}.__main__" if module == "launch" else module, devices=1)
    for (command, run, _), (code, err) in zip(cases, results, strict=True):
      found[command] = (code, err, run)
  return found


@pytest.mark.parametrize("where, command", DRY_RUNS,
                         ids=lambda x: x[:60] if "python" in x else x)
def test_documented_configs_resolve_and_launches_dry_run(dry_runs, where, command):
  """main prints the config it would run; a launch prints what it would run (a dry run,
  its --root moved to a folder of its own); launch.results tabulates trials not started
  yet."""
  code, err, run = dry_runs[command]
  assert code == 0, f"{where}: {run}\n{err[-3000:]}"
  folder = re.search(r"--root=(\S+)/runs", run)
  assert not folder or not os.path.exists(f"{folder.group(1)}/runs") or (
      _module_and_args(command)[0] == "launch.results")


def _as_forked(command: str, folder) -> tuple[str, list[str], str | None] | None:
  """A command's (module, arguments, input file) for conftest.run_forked: `python -m
  MODULE ARGS`, its input `< FILE` or `echo TEXT |` (written to a file in `folder`);
  None for any other shell."""
  lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
  lexer.whitespace_split = True  # Words end at spaces and at | < > ; & only.
  words = list(lexer)
  stdin = None
  if words[0] == "echo" and "|" in words:
    stdin = folder / f"echo_{len(os.listdir(folder))}.txt"
    stdin.write_text(" ".join(words[1:words.index("|")]) + "\n")
    words = words[words.index("|") + 1:]
  if len(words) > 2 and words[-2] == "<":
    stdin, words = words[-1], words[:-2]
  if words[:2] != ["python", "-m"] or set("".join(words)) & set("|<>;&$`"):
    return None
  return words[2], words[3:], None if stdin is None else str(stdin)


def _smoke(command: str) -> str:
  """A documented command on its smoke scale: the `numbers` config's `,smoke` variant
  and 20 training steps."""
  command = re.sub(r"(configs/transformer\.py:numbers)(?=\s|$)", r"\1,smoke", command)
  return re.sub(r"num_train_steps=\d+", "num_train_steps=20", command)


@pytest.mark.slow
def test_the_documented_workflow_on_a_smoke_run(tmp_path):
  """The training command on /tmp/run, then every other documented command on /tmp/run
  (or /tmp/run_...), in the order the docs show them, each on its smoke scale (forked
  from one process that imported them: conftest.run_forked)."""
  (tmp_path / "src.txt").write_text("thirty-four and seven\none hundred one\n")
  (tmp_path / "ref.txt").write_text("vierunddreißig und sieben\neinhunderteins\n")
  on_run = [(f, c) for f, c in COMMANDS if _on_a_run(c)]
  train = next(fc for fc in on_run if "transformer_jax.main" in fc[1])  # First; the
  others = [fc for fc in on_run if fc is not train]  # rest in the docs' order.
  out = _run(_smoke(train[1]), tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  commands = []
  for where, command in others:
    command = _smoke(command)
    module, _ = _module_and_args(command)
    if module == "transformer_jax.benchmark":  # A decoding benchmark: a smaller one.
      command += " --repeats=1"
    commands.append((where, command, _as_forked(_moved_here(command, tmp_path), tmp_path)))
  # In order; each run of plain commands forked from one process (conftest.run_forked).
  for i, (in_bash, group) in enumerate(itertools.groupby(commands, lambda c: c[2] is None)):
    group = list(group)
    if in_bash:
      results = [(out.returncode, out.stderr) for out in
                 (_run(command, tmp_path) for _, command, _ in group)]
    else:
      (tmp_path / f"forked_{i}").mkdir()
      results = [(code, err) for code, _, err in run_forked(
          [case for _, _, case in group], tmp_path / f"forked_{i}", devices=1)]
    for (where, command, _), (code, err) in zip(group, results, strict=True):
      assert code == 0, f"{where}: {command}\n{err[-3000:]}"
  assert (tmp_path / "hyp.txt").read_text().count("\n") == 2
  with open(tmp_path / "run" / "evaluate" / "results.jsonl") as f:  # Each kept apart.
    names = [json.loads(line)["name"] for line in f]
  assert {"test_avg2", "src", "hyp"} <= set(names), names


def test_the_cost_scaling_md_quotes_is_what_the_dry_run_prints(tmp_path):
  """docs/scaling.md's cost of the base reproduction on 8xH100 is the output of the
  command it shows, line for line; launching.md and the experiments quote no step time
  of their own, so no other figure can disagree with it."""
  text = open(os.path.join(ROOT, "docs", "scaling.md"), encoding="utf-8").read()
  command, quoted = re.search(r"```bash\n([^`]*--cost_on=8xH100[^`]*)```\n\n```\n(.*?)```",
                              text, re.S).groups()
  command = re.sub(r"--root=\S+", f"--root={tmp_path}/runs", command.replace("\\\n", " "))
  out = _run(command, tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  printed = out.stdout[out.stdout.index("# base: cost on 8xH100"):]
  assert printed.splitlines() == quoted.splitlines()
  others = [os.path.join(ROOT, "docs", "launching.md"),
            *glob.glob(os.path.join(ROOT, "experiments", "*.py"))]
  for path in others:
    assert not re.search(r"\d ms\b", open(path, encoding="utf-8").read()), path
