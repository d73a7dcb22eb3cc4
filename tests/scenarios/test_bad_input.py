"""Every mistake a user can make on the training command line is answered before
anything is loaded, compiled or written: one line on stderr, exit code 2, the workdir
untouched. Runs main's own flag parser and main() in this process."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, assert_one_line_error, run_commands

NUMBERS = "--config=configs/transformer.py:numbers,smoke"
TEXT = [NUMBERS, "--config.data.task=text"]

CASES = [  # (command-line flags, a phrase the one-line error must contain)
    ([NUMBERS, "--config.model.num_head=4"], "--config.model.num_head: num_head Did you mean"),
    ([NUMBERS, "--config.modle.d_model=64"], "--config.modle.d_model: modle Did you mean"),
    ([NUMBERS, "--config.model.d_model=30"], "config.model.d_model=30"),
    ([NUMBERS, "--config.model.dropout_rate=1.5"], "config.model.dropout_rate=1.5"),
    ([NUMBERS, "--config.model.dtype=float16"], "config.model.dtype='float16'"),
    ([NUMBERS, "--config.model.num_encoder_layers=0"], "config.model.num_encoder_layers=0"),
    ([NUMBERS, "--config.model.max_len=16"], "config.model.max_len=16"),
    ([NUMBERS, "--config.model.key_dim=-1"], "config.model.key_dim=-1"),
    ([NUMBERS, "--config.model.attention_implementation=flash"],
     "config.model.attention_implementation='flash'"),
    ([NUMBERS, "--config.model.vocab_multiple=0"], "config.model.vocab_multiple=0"),
    ([NUMBERS, "--config.train.max_length_buckets=0"], "config.train.max_length_buckets=0"),
    ([NUMBERS, "--config.train.prefetch=-1"], "config.train.prefetch=-1"),
    ([NUMBERS, "--config.decode.max_extra_length=200"], "decode.max_extra_length"),
    ([NUMBERS, "--config.decode.beam_size=0"], "config.decode.beam_size=0"),
    ([NUMBERS, "--config.decode.length_penalty=-1"], "config.decode.length_penalty=-1"),
    ([NUMBERS, "--config.decode.batch_size=0"], "config.decode.batch_size=0"),
    ([NUMBERS, "--config.decode.batch_tokens=-1"], "config.decode.batch_tokens=-1"),
    ([NUMBERS, "--config.optimizer.warmup_steps=0"], "config.optimizer.warmup_steps=0"),
    ([NUMBERS, "--config.optimizer.beta2=1.0"], "config.optimizer.beta2=1.0"),
    ([NUMBERS, "--config.optimizer.epsilon=0.0"], "config.optimizer.epsilon=0.0"),
    ([NUMBERS, "--config.optimizer.learning_rate_multiplier=0.0"],
     "learning_rate_multiplier=0.0"),
    ([NUMBERS, "--config.optimizer.grad_clip_norm=-1.0"], "grad_clip_norm=-1.0"),
    ([NUMBERS, "--config.train.batching=words"], "config.train.batching='words'"),
    ([NUMBERS, "--config.train.num_train_steps=0"], "config.train.num_train_steps=0"),
    ([NUMBERS, "--config.train.label_smoothing=1.0"], "config.train.label_smoothing=1.0"),
    ([NUMBERS, "--config.train.on_nonfinite=ignore"], "config.train.on_nonfinite='ignore'"),
    ([NUMBERS, "--config.train.max_nonfinite_in_row=0"], "max_nonfinite_in_row=0"),
    ([NUMBERS, "--config.train.num_samples=-1"], "config.train.num_samples=-1"),
    ([NUMBERS, "--config.train.bleu_every_steps=-5"], "config.train.bleu_every_steps=-5"),
    ([NUMBERS, "--config.train.grad_accum_steps=0"], "config.train.grad_accum_steps=0"),
    ([NUMBERS, "--config.train.mesh_shape=(3,1,1)"], "train.mesh_shape=(3, 1, 1)"),
    ([NUMBERS, "--config.train.mesh_shape=(16,1,1)"], "needs 16 devices"),
    ([NUMBERS, "--config.train.mesh_shape=(-1,-1,1)"], "at most one -1"),
    ([NUMBERS, "--config.data.task=wmt"], "config.data.task='wmt'"),
    ([NUMBERS, "--config.data.tokenizer_type=word"], "config.data.tokenizer_type='word'"),
    ([NUMBERS, "--config.data.overlong=cut"], "config.data.overlong='cut'"),
    ([NUMBERS, "--config.data.vocab_size=0"], "config.data.vocab_size=0"),
    ([NUMBERS, "--config.data.max_length=0"], "config.data.max_length=0"),
    (TEXT, "config.data.train_files=''"),
    ([NUMBERS, "--config.data.train_files=a.en,a.de"], "unless data.task='text'"),
    (TEXT + ["--config.data.train_files=only_one.txt",
             "--config.data.eval_files=a.txt,b.txt"], "expected 'SOURCE_FILE,TARGET_FILE'"),
    (TEXT + ["--config.data.train_files=/nonexistent/a.en,/nonexistent/a.de",
             "--config.data.eval_files=/nonexistent/b.en,/nonexistent/b.de"],
     "/nonexistent/a.en does not exist"),
    (["--config=configs/nonexistent.py"], "nonexistent.py"),
    (["--config=configs/transformer.py:huge"], "valid: one of numbers"),
    (["--config=configs/transformer.py:numbers,tiny"], "optionally followed by ,smoke"),
    ([NUMBERS, "--bogus_flag=1"], "bogus_flag"),
    ([NUMBERS, "--config.train.num_train_steps=abc"], "abc"),
    ([NUMBERS, "--coordinator_address=localhost:1234"], "--num_processes"),
]


@pytest.fixture(scope="module")
def case_results(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("bad_input")
  cases = [[*argv, f"--workdir={tmp / f'run_{i}'}"] for i, (argv, _) in enumerate(CASES)]
  return tmp, run_commands(cases, tmp)


@pytest.mark.parametrize("index", range(len(CASES)),
                         ids=[" ".join(c[0][1:]) or c[0][0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case_results, index):
  tmp, results = case_results
  code, err = results[index]
  assert_one_line_error(code, err, CASES[index][1])
  assert not (tmp / f"run_{index}").exists()


def test_resuming_with_a_different_model_is_refused_and_changes_nothing(tmp_path):
  workdir = tmp_path / "run"
  workdir.mkdir()
  from configs import transformer as configs
  saved = configs.get_config("numbers,smoke")
  (workdir / "config.json").write_text(saved.to_json_best_effort(indent=2))
  (workdir / "tokenizer.model").write_bytes(b"a tokenizer")  # The run left state.
  before = {p.name: p.read_bytes() for p in workdir.iterdir()}

  [(code, err)] = run_commands([[NUMBERS, "--config.model.d_model=64",
                                    "--config.data.vocab_size=150", f"--workdir={workdir}"]],
                                  tmp_path)
  assert_one_line_error(code, err, "model.d_model: 32 -> 64")
  assert "data.vocab_size: 100 -> 150" in err
  assert {p.name: p.read_bytes() for p in workdir.iterdir()} == before


def test_resume_changes_are_split_into_compatible_and_incompatible():
  from configs import transformer as configs
  from transformer_jax import config as config_lib
  from transformer_jax import checkpoint
  old = config_lib.parse(configs.get_config("numbers,smoke"))
  new_dict = configs.get_config("numbers,smoke")
  new_dict.train.num_train_steps = 40
  new_dict.decode.beam_size = 4
  new_dict.optimizer.grad_clip_norm = 1.0  # Turns clipping on: a new optimizer state.
  incompatible, compatible = checkpoint.config_changes(old, config_lib.parse(new_dict))
  assert set(compatible) == {"decode.beam_size: 2 -> 4", "train.num_train_steps: 20 -> 40",
                             "train.log_every_steps: 5 -> 10",  # Smoke's follow the steps.
                             "train.eval_every_steps: 10 -> 20",
                             "train.checkpoint_every_steps: 10 -> 20"}
  assert incompatible == ["optimizer.grad_clip_norm: 0.0 -> 1.0"]


@pytest.mark.parametrize("saved, allowed", [("wmt14_translate/de-en", True),
                                            ("wmt14_translate/de-en:1.0.1", False),
                                            ("wmt14_translate/fr-en", False),
                                            ("wmt14_translate/de", False)])
def test_a_run_made_before_the_tfds_version_was_pinned_resumes_another_dataset_does_not(
    saved, allowed):
  """A run whose config named the dataset without a version read the builder's only
  one, the version now pinned: it resumes; another version or dataset is refused."""
  from configs import transformer as configs
  from transformer_jax import config as config_lib
  from transformer_jax import checkpoint
  new = config_lib.parse(configs.get_config("base"))
  old_dict = configs.get_config("base")
  old_dict.data.tfds_name = saved
  incompatible, compatible = checkpoint.config_changes(config_lib.parse(old_dict), new)
  change = f"data.tfds_name: {saved!r} -> {new.data.tfds_name!r}"
  assert new.data.tfds_name == "wmt14_translate/de-en:1.0.0"
  assert (compatible, incompatible) == (([change], []) if allowed else ([], [change]))


# --- the other commands: translate, evaluate, launch, launch.results --------------------

BAD_EXPERIMENTS = {  # file name: (contents, a phrase of the error)
    "no_config.py": ('"""No CONFIG."""\ndef trials():\n  return []\n', "must define CONFIG"),
    "syntax.py": ('"""Broken."""\nCONFIG = "configs/transformer.py:numbers"\ndef trials(:\n',
                  "syntax.py:3: SyntaxError"),
    "raises.py": ('"""Raises."""\nCONFIG = "configs/transformer.py:numbers"\n'
                  'def trials():\n  return [1 / 0]\n', "raises.py:4: ZeroDivisionError"),
    "duplicate.py": ('"""Twice."""\nfrom launch import sweep\n'
                     'CONFIG = "configs/transformer.py:numbers"\ndef trials():\n'
                     '  return sweep.named(a={}) + sweep.named(a={})\n', "duplicate trial names"),
    "escape.py": ('"""Escapes."""\nfrom launch import sweep\n'
                  'CONFIG = "configs/transformer.py:numbers"\ndef trials():\n'
                  '  return [sweep.Trial("../x", ())]\n', "is not a plain directory name"),
    "no_file.py": ('"""Missing config."""\nfrom launch import sweep\n'
                   'CONFIG = "configs/missing.py:numbers"\ndef trials():\n'
                   '  return sweep.named(a={})\n', "names no file configs/missing.py"),
}
T3 = "--experiment=experiments/table3.py"
OTHER_CASES = {  # module: [(flags, a phrase of the error)]; W is a run's workdir.
    "transformer_jax.main": [
        ([NUMBERS], "--workdir is required"),
        (TEXT + ["--config.data.train_files=/dev/null,/dev/null",
                 "--config.data.eval_files=README.md,README.md", "--workdir=T/empty"],
         "config.data.train_files='/dev/null,/dev/null': no training pairs (0 lines"),
        ([NUMBERS, "--print_config", "--config.model.d_model=30"], "config.model.d_model=30"),
    ],
    "transformer_jax.translate": [
        ([], "--workdir"),
        (["--workdir=/nonexistent/run"], "/nonexistent/run/config.json not found"),
        (["--workdir=W", "--beam_size=0"], "config.decode.beam_size=0"),
        (["--workdir=W", "--length_penalty=-1"], "config.decode.length_penalty=-1"),
        (["--workdir=W", "--batch_size=abc"], "abc"),
        (["--workdir=W", "--input=/nonexistent.txt"], "--input=/nonexistent.txt does not exist"),
        (["--workdir=W", "--nbest=9"], "--nbest=9: expected 0 to the beam size (2)"),
        (["--workdir=W", "--step=999"], "No checkpoint for step 999"),
        (["--workdir=W", "--step=best"], "kept no best checkpoint: its config has no "
         "train.keep_best_by"),
        (["--workdir=W", "--sample=nucleus:0.9"], "config.decode.sample='nucleus:0.9'"),
        (["--workdir=W", "--sample=topk:5", "--nbest=2"], "--nbest with --sample"),
        (["--workdir=W", "extra"], "unexpected arguments 'extra'"),
    ],
    "transformer_jax.evaluate": [
        (["--workdir=W", "--split=train"], "--split"),
        (["--workdir=/nonexistent/run"], "/nonexistent/run/config.json not found"),
        (["--workdir=W", "--average_last=0"], "--average_last=0"),
        (["--workdir=W", "--beam_size=0"], "config.decode.beam_size=0"),
        (["--workdir=W", "--average_last=2"], "No checkpoint in"),
        ([], "--workdir is required"),
        (["--workdir=W", "--source=/nonexistent.en", "--reference=/nonexistent.de"],
         "--source=/nonexistent.en does not exist"),
        (["--hypotheses=/nonexistent.txt"], "--hypotheses needs --reference"),
        (["--hypotheses=/nonexistent.txt", "--reference=/nonexistent.de"],
         "--hypotheses=/nonexistent.txt does not exist"),
        (["--workdir=W", "--hypotheses=W/config.json", "--source=W/config.json",
          "--reference=W/config.json"], "takes no --source"),
        (["--workdir=W", "--source=/dev/null", "--reference=/dev/null"],
         "--source=/dev/null and --reference=/dev/null are empty: nothing to score"),
        (["--hypotheses=/dev/null", "--reference=/dev/null"],
         "--hypotheses=/dev/null and --reference=/dev/null are empty"),
    ],
    "transformer_jax.score": [
        (["--workdir=W", "--source=/nonexistent.en", "--target=/nonexistent.de"],
         "/nonexistent.en"),
        (["--workdir=W", "--source=README.md", "--target=README.md", "--step=x"],
         "--step='x': expected a checkpoint step or 'best'"),
    ],
    "transformer_jax.export": [
        ([], "--workdir"),
        (["--workdir=/nonexistent/run"], "/nonexistent/run/config.json not found"),
        (["--workdir=W", "--format=onnx"], "--format=onnx"),
        (["--workdir=W", "--average_last=0"], "--average_last=0"),
        (["--workdir=W", "--step=5"], "No checkpoint in"),
    ],
    "transformer_jax.benchmark": [
        ([], "give exactly one of --config"),
        (["--workdir=W", "--config=configs/transformer.py:numbers"], "exactly one of"),
        (["--workdir=/nonexistent/run"], "/nonexistent/run/config.json not found"),
        (["--workdir=W", "--split=train"], "--split=train"),
        (["--workdir=W"], "No checkpoint in"),
    ],
    "launch.__main__": [
        (["--experiment=/nonexistent.py"], "No experiment file /nonexistent.py"),
        *[([f"--experiment=E/{name}"], phrase)
          for name, (_, phrase) in BAD_EXPERIMENTS.items()],
        ([T3, "--set=novalue"], "--set='novalue': expected PATH=VALUE"),
        ([T3, "--set=train.num_train_step=200", "--dry_run"],  # Before any trial starts.
         "trial base: --config.train.num_train_step: num_train_step Did you mean"),
        ([T3, "--set=model.dropout_rate=2", "--dry_run"],
         "trial base: config.model.dropout_rate=2"),
        ([T3, "--trials=nope"], "unknown trials ['nope']"),
        ([T3, "--target=tpu"], "--target=tpu needs --tpu_name and --zone"),
        ([T3, "--target=cloud"], "--target"),
        ([T3, "--processes=x"], "--processes"),
    ],
    "launch.results": [
        (["--experiment=/nonexistent.py"], "No experiment file /nonexistent.py"),
        (["--experiment=E/syntax.py"], "syntax.py:3: SyntaxError"),
    ],
}


@pytest.fixture(scope="module")
def run_workdir(tmp_path_factory):
  """A run's config and tokenizer (no checkpoint: every case fails before needing one)."""
  from configs import transformer as configs
  from transformer_jax.data import number_words, tokenizer
  workdir = tmp_path_factory.mktemp("run")
  (workdir / "config.json").write_text(configs.get_config("numbers,smoke").to_json())
  src, tgt = number_words.make_split("train", 200, 16)
  tokenizer.load_or_train(workdir / "tokenizer.model", src + tgt, 100)
  return workdir


@pytest.mark.parametrize("module", OTHER_CASES)
def test_other_commands_answer_bad_input_in_one_line(module, run_workdir, tmp_path):
  for name, (text, _) in BAD_EXPERIMENTS.items():
    (tmp_path / name).write_text(text)
  before = sorted(p.name for p in run_workdir.iterdir())
  cases = [[a.replace("--workdir=W", f"--workdir={run_workdir}").replace(
      "--experiment=E/", f"--experiment={tmp_path}/").replace("=T/", f"={tmp_path}/")
      for a in argv]
      for argv, _ in OTHER_CASES[module]]
  results = run_commands(cases, tmp_path, module)
  for (argv, phrase), (code, err) in zip(OTHER_CASES[module], results):
    assert_one_line_error(code, err, phrase)
  assert sorted(p.name for p in run_workdir.iterdir()) == before
  print(f"{module}: {len(results)} bad inputs answered in one line with exit code 2")


@pytest.mark.parametrize("module", ["transformer_jax.main", "transformer_jax.translate",
                                    "transformer_jax.evaluate", "transformer_jax.score",
                                    "transformer_jax.export",
                                    "transformer_jax.benchmark", "launch", "launch.results"])
def test_help_prints_the_usage_and_exits_0(module):
  out = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "python -m" in out.stdout and "--" in out.stdout, out.stdout  # Usage and flags.


def test_print_config_prints_the_resolved_config_and_exits_0():
  out = subprocess.run([sys.executable, "-m", "transformer_jax.main", NUMBERS,
                        "--config.model.d_model=64", "--print_config"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  config = json.loads(out.stdout)
  assert config["model"]["d_model"] == 64 and config["train"]["num_train_steps"] == 20


def test_a_config_path_from_another_folder_names_the_repositorys_file(tmp_path):
  """configs/transformer.py given in another folder: one line with the file's real path."""
  out = subprocess.run([sys.executable, "-m", "transformer_jax.main", NUMBERS,
                        f"--workdir={tmp_path / 'run'}"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": ROOT})
  assert_one_line_error(out.returncode, out.stderr, "--config=configs/transformer.py: no "
                         f"such file in {tmp_path}; this repository's is "
                         f"{os.path.join(ROOT, 'configs', 'transformer.py')}")
  assert not (tmp_path / "run").exists()
