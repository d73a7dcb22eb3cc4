"""Test setup: 8 simulated CPU devices, set before JAX is imported anywhere."""

import concurrent.futures
import json
import gzip
import hashlib
import importlib.metadata
import os
import random
import socket
import subprocess
import sys


JAXLIB = importlib.metadata.version("jaxlib")


def xla_flags(devices: int, jaxlib: str = JAXLIB) -> str:
  """XLA_FLAGS for a test process with `devices` simulated CPU devices, run by `jaxlib`
  (this one's, or another Python's). The tests compile far more than they compute, so
  what speeds compiling up is on, the same in every process a test starts, so that
  their results compare: LLVM's optimizations off (a smoke run: 18 user-s without them,
  27 with), its expensive passes too, and on JAX 0.10 XLA's new CPU fusion emitters
  (0.11 has only those): the smoke config's two train steps and its beam search compile
  in 3.6-3.8 s with them off, 6.0-8.3 s with them on; the steps run as fast, beam
  search about half as fast, which the tests' few sentences do not notice."""
  flags = [f"--xla_force_host_platform_device_count={devices}",
           "--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true"]
  if jaxlib.startswith("0.10."):
    flags.append("--xla_cpu_use_fusion_emitters=false")
  return " ".join(flags)


if xla_flags(8) not in os.environ.get("XLA_FLAGS", ""):  # xdist's workers inherit them.
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + xla_flags(8)).strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The CPU only: libtpu, installed for the compile-only TPU tests, would look for a TPU.
os.environ["JAX_PLATFORMS"] = "cpu"
# Every run the tests start (subprocesses included) shares compiled programs through
# JAX's persistent cache, as a user's restarts can (README: "Compilation cache").
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  import atexit, shutil, tempfile  # noqa: E401
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="jax_cache_")
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], True)

import jax  # noqa: E402  (must follow the flags above)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from configs import transformer as transformer_configs  # noqa: E402
from transformer_jax import config as config_lib
from transformer_jax.data import parallel_data
from transformer_jax.inference import scoring
from transformer_jax.model import beam_search

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The offline text (its README): ../shared/data beside the repository, or $SHARED_DATA
# (the mutation runner's copies of the tree live elsewhere).
SHARED_DATA = os.environ.get("SHARED_DATA") or os.path.join(ROOT, "..", "shared", "data")


# Two layers a stack (the shipped smoke configs have one), for the tests where what is
# done per layer must be checked across layers, or whose figures count layers.
TWO_LAYERS = {"num_encoder_layers": 2, "num_decoder_layers": 2}
TWO_LAYER_FLAGS = [f"--config.model.{field}={n}" for field, n in TWO_LAYERS.items()]


def smoke_config(name: str = "numbers", vocab_size: int = 37,
                 **overrides) -> config_lib.Config:
  """The shipped `NAME,smoke` config, typed, with TWO_LAYERS, a vocabulary and section
  overrides (`model={"dropout_rate": 0.0}`)."""
  config = transformer_configs.get_config(f"{name},smoke")
  config.model.update(TWO_LAYERS)
  for section, values in overrides.items():
    config[section].update(values)
  return config_lib.with_vocab(config_lib.parse(config), vocab_size)


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def start_training(workdir, flags, processes: int = 1, devices_per_process: int = 1,
                   code_dirs=None, prepare: bool = True):
  """`python -m transformer_jax.main` as `processes` processes on localhost (CPU
  collectives), each with `devices_per_process` simulated devices, process i importing
  the code in code_dirs[i] (default: this tree); returns the Popens (output merged into
  stdout). `flags` start with --config. Several processes build no data: as the
  launcher does, one process prepares it first (`prepare`), and this waits for it."""
  env = {**os.environ, "XLA_FLAGS": xla_flags(devices_per_process),
         "JAX_PLATFORMS": "cpu"}
  args = [sys.executable, "-m", "transformer_jax.main", f"--workdir={workdir}", *flags]
  if processes > 1 and prepare:
    prepared = subprocess.run([*args, "--prepare_data"], cwd=(code_dirs or [ROOT])[0],
                              env=env, capture_output=True, text=True, timeout=600)
    assert prepared.returncode == 0, prepared.stderr[-3000:]
  port = free_port()
  return [subprocess.Popen(
      args + ([f"--coordinator_address=localhost:{port}", f"--num_processes={processes}",
               f"--process_id={i}"] if processes > 1 else []),
      cwd=(code_dirs or [ROOT] * processes)[i], env=env, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True) for i in range(processes)]


def outputs_of(procs, timeout: float = 600) -> list[str]:
  """Each process's whole output, read from all of them at once (read one after the
  other, a full pipe would stall the writer, and with it the collectives)."""
  with concurrent.futures.ThreadPoolExecutor(len(procs)) as pool:
    return list(pool.map(lambda p: p.communicate(timeout=timeout)[0], procs))


def strict_interpreter():
  """Pallas's checking interpreter, for the kernels' tests: a read outside a program's
  block raises (interpret=True clamps it, as a GPU does not), and memory no program
  wrote holds NaN."""
  from jax.experimental.pallas import tpu as pltpu
  return pltpu.InterpretParams(out_of_bounds_reads="raise", uninitialized_memory="nan")


def relative_difference(a, b) -> float:
  """max |a - b| / max |b| of two arrays or numbers, in float64 (max |a| where b is 0)."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  scale = np.abs(b).max()
  return float(np.abs(a - b).max() / scale if scale else np.abs(a).max())


def max_relative_difference(a, b) -> float:
  """relative_difference of the worst tensor of two trees."""
  return max(jax.tree.leaves(jax.tree.map(relative_difference, a, b)))


# Two computations of one training (other devices, processes, microbatches, layers
# scanned, a resume, the loss in chunks) differ in rounding alone. Their difference is
# bounded by a control measured in the same test: the same comparison between the
# reference and the reference with every initial parameter one float32 ulp up
# (train.perturb_init_ulps=1), which changes rounding and nothing else. A difference
# below float32's resolution (FLOAT32_EPS, relative) cannot be resolved, so the control
# counts as at least that. ROUNDING_K: these tests' computations measured 0 to 3.4
# times their control (results.md, "Comparisons bounded by rounding"); a change of
# mathematics (the gradient averaged over the wrong count, the smoothing term dropped,
# another process's rows, Adam restarted on resume) at least 3,000 times it. 10 leaves
# room for another machine's rounding and none for a change. Rounding must not decide a
# branch, or one element could decide the comparison: the paper's ReLU keeps or drops a
# unit by the sign of its input, and an input within rounding of 0 goes either way (the
# scanned layers on a (2,2,2) mesh against one device: one flipped unit at the third
# step, parameters 0.0356 apart against a control of 3.9e-6). So comparisons train with
# a smooth activation, GELU, which has no branch; those whose subject is the ReLU
# itself compare one step from the same parameters, where both compute the same inputs.
ROUNDING_CONTROL = "--config.train.perturb_init_ulps=1"
ROUNDING_K = 10.0
FLOAT32_EPS = float(np.finfo(np.float32).eps)


def assert_within_rounding(differences: dict[str, float], controls: dict[str, float],
                           k: float = ROUNDING_K) -> None:
  """Each difference (relative, by name) at most k times its control; the controls
  must have seen the perturbation (a control of exactly 0 in every quantity would
  mean the nudge did nothing, and the bound nothing)."""
  assert any(controls.values()), f"the control saw no difference: {controls}"
  report = {name: f"{differences[name]:.3g} vs control {controls[name]:.3g}"
            for name in differences}
  print("differences (relative):", report)  # Shown by pytest -s, and on failure.
  for name, difference in differences.items():
    assert difference <= k * max(controls[name], FLOAT32_EPS), (name, report)


def relative_differences(history, reference, names) -> dict[str, float]:
  """The largest relative difference of each of `names` over the steps (dicts of
  name -> value, one per step or window)."""
  return {name: max(relative_difference(a[name], b[name])
                    for a, b in zip(history, reference, strict=True))
          for name in names}


# Overrides for comparing two runs' parameters: no dropout, Adam's epsilon at 1e-4, not
# the paper's 1e-9, and a smooth activation (SMOOTH_ACTIVATION). With 1e-9 a near-zero
# gradient moves its parameter by about lr * sign(g), so float rounding (sums taken in
# another order, as on other devices) can flip whole steps and grow: runs on the same
# batches end up to 3e-3 apart after 20 steps. With 1e-4 they stay within about 1e-4,
# and other batches differ by 0.5.
SMOOTH_ACTIVATION = "gelu"
COMPARABLE_RUNS = ["--config.model.dropout_rate=0.0", "--config.optimizer.epsilon=1e-4",
                   f"--config.model.activation={SMOOTH_ACTIVATION}"]


def checkpoint_state(workdir: str, step: int):
  """A checkpoint's whole train state on one local device, whatever topology saved it."""
  import orbax.checkpoint as ocp
  path = os.path.join(workdir, "checkpoints", str(step), "default")
  checkpointer = ocp.StandardCheckpointer()
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                        checkpointer.metadata(path).item_metadata)
  return checkpointer.restore(path, target)


_DRIVER = """
import importlib, json, os, runpy, sys
cases, folder = json.loads(sys.argv[1]), sys.argv[2]
for name, _, _ in cases:  # Imported once (and all they import); each case forks.
  importlib.import_module(name)
results = []
for i, (name, argv, stdin) in enumerate(cases):
  out_path, err_path = (os.path.join(folder, f"{s}_{i}") for s in ("out", "err"))
  pid = os.fork()
  if pid == 0:  # `python -m NAME ARGV < STDIN`: its __main__ block, in a fresh process.
    for fd, path, mode in ((0, stdin or os.devnull, os.O_RDONLY),
                           (1, out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                           (2, err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
      os.dup2(os.open(path, mode), fd)
    sys.modules.pop(name)  # Run afresh as __main__ (what it imports stays imported).
    sys.argv, code = [name, *argv], 0
    try:
      runpy.run_module(name, run_name="__main__", alter_sys=True)
    except SystemExit as e:
      code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
  _, status = os.waitpid(pid, 0)
  results.append([os.waitstatus_to_exitcode(status), open(out_path).read(),
                  open(err_path).read()])
print(json.dumps(results))
"""


def run_forked(cases: list[tuple[str, list[str], str | None]], tmp_dir, *,
               prefix: tuple[str, ...] = (), devices: int = 8) -> list[tuple[int, str, str]]:
  """Runs `python -m MODULE ARGV < STDIN` for each (MODULE, ARGV, STDIN file or None), in
  order, each forked from one process that imported every MODULE first (about 2 s of
  start-up a command saved: 45 commands take seconds, not minutes), under the command
  `prefix` if given (a read-only mount, another HOME), with `devices` simulated devices;
  returns (exit code, stdout, stderr) of each."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": xla_flags(devices)}
  out = subprocess.run([*prefix, sys.executable, "-c", _DRIVER, json.dumps(cases),
                        str(tmp_dir)], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=900, stdin=subprocess.DEVNULL)
  assert out.returncode == 0, out.stderr[-3000:]
  return [tuple(result) for result in json.loads(out.stdout.splitlines()[-1])]


def run_commands(cases: list[list[str]], tmp_dir, module: str = "transformer_jax.main", *,
                 prefix: tuple[str, ...] = (), devices: int = 8) -> list[tuple[int, str]]:
  """run_forked with one MODULE, and no input, for each ARGV in `cases`; returns (exit
  code, stderr) of each."""
  return [(code, err) for code, _, err in
          run_forked([(module, argv, None) for argv in cases], tmp_dir, prefix=prefix,
                     devices=devices)]


def assert_one_line_error(code, err, phrase):
  """Exit code 2 and one line on stderr, "error: ...", containing `phrase`."""
  lines = [l for l in err.splitlines() if l.strip() and not l.startswith(("I", "W"))]
  assert code == 2, err  # cli.EXIT_INPUT
  assert lines and lines[0].startswith("error: "), err
  assert "Traceback" not in err, err
  assert phrase in lines[0], lines[0]
  assert len(lines) == 1, err


def write_lines(path, lines) -> str:
  """UTF-8 lines, gzip-compressed when `path` ends in .gz."""
  opener = gzip.open if str(path).endswith(".gz") else open
  with opener(path, "wb") as f:
    f.write(("\n".join(lines) + "\n").encode("utf-8"))
  return str(path)


def newstest_standin(directory) -> str:
  """`directory` with newstest2014.en and .de (300 lines of generated number words,
  pairs of a few to about 60 tokens) for the benchmark's --newstest_dir."""
  from transformer_jax.data import number_words
  os.makedirs(directory, exist_ok=True)
  en, de = number_words.make_split("test", 300, 300)
  write_lines(os.path.join(directory, "newstest2014.en"), en)
  write_lines(os.path.join(directory, "newstest2014.de"), de)
  return str(directory)


MULTI30K_STANDIN_SIZES = {"train": 2000, "val": 100, "test_2016_flickr": 50}


def multi30k_standin(directory) -> dict[str, str]:
  """The six gzip files of a Multi30k manual directory, with generated sentence pairs
  (sizes MULTI30K_STANDIN_SIZES); returns their SHA-256 sums by file name, to stand in
  for the release's checksums.tsv."""
  from transformer_jax.data import number_words
  os.makedirs(directory, exist_ok=True)
  sums = {}
  for stem, count in MULTI30K_STANDIN_SIZES.items():
    pair = number_words.make_split("train", count, 10, seed=len(stem))
    for lang, lines in zip(("en", "de"), pair):
      path = write_lines(os.path.join(directory, f"{stem}.{lang}.gz"), lines)
      with open(path, "rb") as f:
        sums[os.path.basename(path)] = hashlib.sha256(f.read()).hexdigest()
  return sums


def tiny_training_config(steps: int):
  """The numbers task at a size that learns in tens of steps, on all 8 simulated devices."""
  config = transformer_configs.get_config("numbers,smoke")
  config.model.update(num_encoder_layers=1, num_decoder_layers=1)  # Learns fast enough.
  config.optimizer.warmup_steps = 20
  config.data.update(num_eval_examples=16, max_length=32)
  # Eight length buckets, as the chunked-loss bound was measured with (padding
  # changes how far Adam carries rounding over 40 steps).
  config.train.update(num_train_steps=steps, batch_tokens=512, log_every_steps=10,
                      eval_every_steps=20, checkpoint_every_steps=20, max_length_buckets=8)
  config.decode.batch_size = 16
  config.train.mesh_shape = (-1, 1, 1)  # All 8 simulated devices, data parallel.
  return config


def numbers_data(count: int = 3000, **overrides) -> config_lib.DataConfig:
  """The numbers task's data config with `count` training pairs."""
  overrides = {"tokenizer_sentences": 20_000, "vocab_size": 100, **overrides}
  return config_lib.DataConfig(task="numbers", max_length=48, num_train_examples=count,
                               num_eval_examples=32, **overrides)


def toy_data(n: int, max_len: int = 30) -> parallel_data.ParallelData:
  """`n` random id sequences of 2 to max_len - 1 tokens (seeded), paired with the same
  sequences in reverse order, so sources and targets differ in length."""
  rng = np.random.default_rng(0)
  seqs = [rng.integers(3, 20, size=rng.integers(2, max_len)).astype(np.int32)
          for _ in range(n)]
  return parallel_data.ParallelData(seqs, seqs[::-1])


def stacked_layers(params: dict, num_encoder_layers: int, num_decoder_layers: int) -> dict:
  """Unrolled parameters (encoder_0, ...) as model.scan_layers keeps them: each stack's
  layers stacked on a leading axis."""
  stack = lambda prefix, n: {"layer": jax.tree.map(
      lambda *xs: jnp.stack(xs), *[params[f"{prefix}_{i}"] for i in range(n)])}
  stacked = {k: v for k, v in params.items() if not k.startswith(("encoder_", "decoder_"))}
  stacked["encoder_stack"] = stack("encoder", num_encoder_layers)
  stacked["decoder_stack"] = stack("decoder", num_decoder_layers)
  return stacked


def teacher_forced_log_prob(model, params, sources, targets) -> np.ndarray:
  """log P(targets | sources) per row from the full forward pass, summed over the
  targets' non-padding positions (each target row includes its EOS)."""
  return np.asarray(scoring.sequence_log_probs(params, jnp.asarray(sources),
                                               jnp.asarray(targets), model=model))


def table_decoder(table, vocab) -> beam_search.Decoder:
  """A 'model' given as next-token probabilities per prefix: {prefix tuple: probs}.
  The cache [n, max_len] holds, in each row, the tokens that row was fed: column c is
  token c, fed at step c + 1; beam search reselects its rows."""
  def step(tokens, cache, i):
    cache = jax.lax.dynamic_update_slice(cache, tokens, (0, jnp.maximum(i - 1, 0)))
    cache = jnp.where(i == 0, 0, cache)

    def row_logits(prefix):
      result = jnp.full((vocab,), -1e9)
      for key, probs in table.items():
        match = jnp.array(True) if not key else jnp.all(prefix[:len(key)] == jnp.array(key))
        match = match & (i == len(key))
        result = jnp.where(match, jnp.log(jnp.array(probs) + 1e-30), result)
      return result
    return jax.vmap(row_logits)(cache), cache
  return beam_search.Decoder(step, grow=lambda cache, length: cache,
                             select_rows=lambda cache, rows: cache[rows])


@pytest.fixture
def tiny_model_config() -> config_lib.ModelConfig:
  """The smoke config's model: compiles in seconds, with every code path present."""
  return smoke_config().model


@pytest.fixture
def rng():
  return jax.random.key(0)


COPY_WORDS = "red green blue cat dog fish one two three big small old new sun moon star".split()


def copy_task_files(directory, counts: dict[str, int], seed: int = 0) -> dict[str, str]:
  """For each split, files of word lists and the same lists in upper case (a copy task
  whose outputs depend on the source): {split: "SOURCE_FILE,TARGET_FILE"}."""
  rng, found = random.Random(seed), {}
  for split, count in counts.items():
    lines = [" ".join(rng.choices(COPY_WORDS, k=rng.randint(3, 9))) for _ in range(count)]
    source, target = directory / f"{split}.src", directory / f"{split}.tgt"
    source.write_text("".join(line + "\n" for line in lines))
    target.write_text("".join(line.upper() + "\n" for line in lines))
    found[split] = f"{source},{target}"
  return found


def train_copy_task(root) -> str:
  """A small model trained for 400 steps to copy word lists into upper case: its
  outputs depend on the source (the copy is imperfect), so a test reaches every
  exported weight, cross-attention included. Without dropout it learns enough in 400
  steps on any of our CPUs (with dropout 0.1, beam 4 gave 8 distinct outputs for the
  32 sources on one run and 21 on another). Trained by `python -m transformer_jax.main`
  on one device: in the test process, on its 8 simulated devices, it took 62 CPU-s
  instead of 45. Returns its workdir."""
  files = copy_task_files(root, {"train": 5000, "eval": 32})
  flags = ["--config=configs/transformer.py:numbers,smoke", "--config.data.task=text",
           "--config.data.vocab_size=64", f"--config.data.train_files={files['train']}",
           f"--config.data.eval_files={files['eval']}", "--config.train.num_train_steps=400",
           "--config.train.eval_every_steps=400", "--config.train.checkpoint_every_steps=400",
           "--config.train.max_length_buckets=1", "--config.optimizer.warmup_steps=40",
           "--config.model.dropout_rate=0.0", *TWO_LAYER_FLAGS]
  procs = start_training(root / "run", flags)
  [out] = outputs_of(procs)
  assert procs[0].returncode == 0, out[-3000:]
  return str(root / "run")


def once_a_session(tmp_path_factory, worker_id, name: str, make) -> str:
  """`make(folder)`'s result (a string), made once for the whole session: the first
  xdist worker to ask makes it in the workers' common temporary folder, under a lock
  the others wait on."""
  import fcntl
  shared = tmp_path_factory.getbasetemp()
  shared = shared if worker_id == "master" else shared.parent
  with open(shared / f"{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    done = shared / name / "made"
    if not done.exists():
      (shared / name).mkdir(exist_ok=True)
      done.write_text(make(shared / name))
    return done.read_text()


@pytest.fixture(scope="session")
def trained_workdir(tmp_path_factory, worker_id) -> str:
  """train_copy_task's run, trained once for the whole session (export's and Hugging
  Face's tests read it; none writes into it; 400 steps: about 50 s here)."""
  return once_a_session(tmp_path_factory, worker_id, "copy_task", train_copy_task)


def train_smoke_run(root) -> str:
  """`python -m transformer_jax.main` on the embedded default's smoke config
  (numbers,smoke: 20 steps, checkpoints at 10 and 20) on one device; its workdir."""
  run = os.path.join(root, "run")
  out = subprocess.run([sys.executable, "-m", "transformer_jax.main",
                        "--config=configs/transformer.py:numbers,smoke", f"--workdir={run}"],
                       cwd=ROOT, env={**os.environ, "XLA_FLAGS": xla_flags(1),
                                      "JAX_PLATFORMS": "cpu"},
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  return run


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory, worker_id) -> str:
  """train_smoke_run's run, trained once for the whole session; tests that write into a
  run take a copy (smoke_run_copy)."""
  return once_a_session(tmp_path_factory, worker_id, "smoke_run", train_smoke_run)


def smoke_run_copy(smoke_run, folder) -> str:
  """A copy of the session's smoke run in `folder`, for a test or module to write into."""
  import shutil
  return shutil.copytree(smoke_run, os.path.join(folder, "run"), symlinks=True)
