"""Hugging Face's MarianMT format: a run exported loads in transformers and computes
what the run computes; a MarianMT folder shaped like OPUS-MT's imports, translates as
transformers does, fine-tunes, and exports back bit for bit."""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import sentencepiece as spm

from configs import transformer as transformer_configs
from conftest import (ROUNDING_K, ROOT, assert_within_rounding, copy_task_files,
                      relative_difference)
from transformer_jax import config as config_lib, import_model
from transformer_jax.config import EOS_ID, PAD_ID
from transformer_jax.data import corpora
from transformer_jax.inference import huggingface as hf, restore, translation
from transformer_jax.training import step as step_lib

torch = pytest.importorskip("torch")  # In '.[test]': CI runs these.
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
  """PyTorch on one thread in this file: its models are tiny (d_model 32), and its
  threads, which spin while they wait for each other, fight the other test process for
  the cores. opus_folder's 300 steps took 115 CPU-s on two threads on a busy 2-core
  machine, 9 on one."""
  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  yield
  torch.set_num_threads(threads)


def _load(folder: str):
  model = transformers.MarianMTModel.from_pretrained(folder).eval()
  return model, transformers.MarianTokenizer.from_pretrained(folder)


def _padded(rows: list[list[int]], pad: int = PAD_ID) -> np.ndarray:
  width = max(map(len, rows))
  return np.array([r + [pad] * (width - len(r)) for r in rows])


def _their_logits(model, src: list[list[int]], tgt: list[list[int]], pad: int, start: int
                  ) -> np.ndarray:
  """transformers' teacher-forced logits [batch, length, vocab] (Marian's ids)."""
  inputs = torch.tensor(_padded(src, pad))
  decoder_inputs = torch.tensor(_padded([[start] + t[:-1] for t in tgt], pad))
  with torch.no_grad():
    return model(input_ids=inputs, attention_mask=inputs != pad,
                 decoder_input_ids=decoder_inputs).logits.numpy()


def _our_logits(trained, params, src, tgt) -> np.ndarray:
  return np.asarray(trained.model.apply({"params": params}, jnp.asarray(_padded(src)),
                                        jnp.asarray(_padded(tgt)), deterministic=True))


def _their_search(model, src: list[list[int]], pad: int, beam: int, extra: int,
                  alpha: float = 1.0, nbest: int = 0) -> list:
  """transformers' generate, one source at a time (its length limit is one a call; ours
  is the source's length + `extra`, EOS included), outputs without start and EOS."""
  out = []
  beam_settings = dict(length_penalty=alpha, early_stopping="never") if beam > 1 else {}
  for row in src:
    result = model.generate(
        torch.tensor([row]), attention_mask=torch.ones(1, len(row), dtype=torch.bool),
        num_beams=beam, do_sample=False, max_length=1 + len(row) + extra,
        num_return_sequences=max(nbest, 1), output_scores=bool(nbest),
        return_dict_in_generate=True, **beam_settings)
    seqs = [[t for t in s[1:] if t != pad] for s in result.sequences.tolist()]
    seqs = [s[: s.index(model.config.eos_token_id)] if model.config.eos_token_id in s else s
            for s in seqs]
    out.append(list(zip(seqs, result.sequences_scores.tolist())) if nbest else seqs[0])
  return out


def _assert_same_nbest(theirs: list, ours: list, limits: list[int],
                       tolerance: float = 1e-4) -> int:
  """The same n-best lists: the same scores (to `tolerance`), best first, and the same
  hypotheses; only hypotheses whose scores tie (within `tolerance`) may come in either
  order. Left out: sources where a hypothesis on either side runs to its length limit
  (`limits`: tokens with the EOS), where transformers' forced EOS costs nothing and
  ours its log-probability (docs/interop.md); returns how many."""
  left_out = 0
  for their, our, limit in zip(theirs, ours, limits, strict=True):
    if any(len(ids) + 1 >= limit for ids, _ in their + our):
      left_out += 1
      continue
    np.testing.assert_allclose([s for _, s in their], [s for _, s in our], atol=tolerance,
                               err_msg=f"{their}\n{our}")
    ties = lambda n, score: sorted(ids for ids, s in n if abs(s - score) <= tolerance)
    for (ids, score), (other, _) in zip(their, our):
      assert ids == other or ties(their, score) == ties(our, score), (their, our)
  return left_out


def _nbest_agree(theirs: list, ours: list, src: list[list[int]], extra: int) -> None:
  """`_assert_same_nbest`, most sources compared: a model that ends its outputs leaves
  few at the limit (at most a quarter; the search rules are what is tested)."""
  left_out = _assert_same_nbest(theirs, ours, [len(row) + extra for row in src])
  print(f"beam 4: {len(src) - left_out} of {len(src)} n-best lists compared, the rest at "
        "the length limit")
  assert left_out <= len(src) // 4


@pytest.mark.slow
def test_the_export_loads_in_transformers_and_computes_what_the_run_does(trained_workdir,
                                                                          tmp_path):
  """MarianMTModel and MarianTokenizer load the export with no code of ours; the same
  ids, the same teacher-forced logits on a padded batch, the same greedy outputs, and
  at beam 4 with transformers' length penalty (|Y|^a: length_penalty_form "fairseq")
  and its finishing rule (finish_within_beam) the same n-best lists and scores, but
  where a hypothesis runs to the length limit (transformers' forced EOS is free)."""
  folder = hf.export_huggingface(trained_workdir, str(tmp_path / "hf"))
  assert sorted(os.listdir(folder)) == [
      "README.md", "config.json", "generation_config.json", "model.safetensors",
      "source.spm", "target.spm", "tokenizer_config.json", "vocab.json"]
  theirs, their_tok = _load(folder)
  trained = restore.load_workdir(trained_workdir)
  params, _ = restore.restore_params(trained)
  sources, references = corpora.corpus(trained.cfg.data).split("eval")
  src, tgt = trained.tokenizer.encode(sources), trained.tokenizer.encode(references, True)
  assert their_tok(sources)["input_ids"] == src
  assert their_tok(text_target=references)["input_ids"] == tgt

  ours = _our_logits(trained, params, src, tgt)
  real = _padded(tgt) != PAD_ID
  theirs_logits = _their_logits(theirs, src, tgt, PAD_ID, PAD_ID)
  # The same weights compute the same function with the same LayerNorm epsilon: only
  # float rounding apart, bounded by a control (ours from weights one float32 ulp away).
  # 0.1 set on both sides, where a norm the epsilon missed shows, and MarianMT's 1e-5.
  logits = lambda model, params: np.asarray(model.apply(
      {"params": params}, jnp.asarray(_padded(src)), jnp.asarray(_padded(tgt))))[real]
  nudged_params = jax.tree.map(lambda x: step_lib.perturb(x, 1), params)
  for epsilon in (0.1, hf.MARIAN_EPSILON):  # MarianMT's own last: the searches below.
    for norm in theirs.modules():
      if isinstance(norm, torch.nn.LayerNorm):
        norm.eps = epsilon
    alike = type(trained.model)(dataclasses.replace(trained.cfg.model,
                                                   layer_norm_epsilon=epsilon))
    reference = logits(alike, params)
    off = relative_difference(_their_logits(theirs, src, tgt, PAD_ID, PAD_ID)[real],
                              reference)
    control = relative_difference(logits(alike, nudged_params), reference)
    print(f"logits with epsilon {epsilon:g} on both sides: {off:.2e} apart, control "
          f"{control:.2e}; with the run's {trained.cfg.model.layer_norm_epsilon:g}: "
          f"{relative_difference(theirs_logits[real], ours[real]):.2e}")
    assert_within_rounding({"logits": off}, {"logits": control})

  extra = 10
  greedy = config_lib.DecodeConfig(beam_size=1, max_extra_length=extra)
  ours_greedy = translation.translate_ids(params, trained.model, src, greedy)
  assert len(set(map(tuple, ours_greedy))) > len(src) // 2  # Real, varied outputs.
  assert _their_search(theirs, src, PAD_ID, 1, extra) == ours_greedy
  assert their_tok.batch_decode([o + [EOS_ID] for o in ours_greedy],
                                skip_special_tokens=True) == [
      trained.tokenizer.decode(o) for o in ours_greedy]

  beam = config_lib.DecodeConfig(beam_size=4, length_penalty=1.0, max_extra_length=extra,
                                 length_penalty_form="fairseq", finish_within_beam=True)
  ours_nbest = translation.translate_ids(params, trained.model, src, beam, nbest=4)
  their_nbest = _their_search(theirs, src, PAD_ID, 4, extra, alpha=1.0, nbest=4)
  _nbest_agree(their_nbest, ours_nbest, src, extra)


def test_a_run_marianmt_cannot_express_is_refused_in_one_line(trained_workdir, tmp_path):
  """Pre-norm layers (for one) have no MarianMT form: one line naming the field, exit 2,
  nothing written."""
  run = tmp_path / "pre_norm"
  run.mkdir()
  config = json.loads((pathlib.Path(trained_workdir, "config.json")).read_text())
  config["model"]["pre_norm"] = True
  (run / "config.json").write_text(json.dumps(config))
  (run / "tokenizer.model").write_bytes(pathlib.Path(trained_workdir, "tokenizer.model")
                                        .read_bytes())
  result = subprocess.run(
      [sys.executable, "-m", "transformer_jax.export", "--format=huggingface",
       f"--workdir={run}", f"--output={tmp_path / 'hf'}"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 2, result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
      f"error: {run} cannot be exported as MarianMT: model.pre_norm=True: MarianMT's "
      "layers are post-norm (the paper's).")
  assert not (tmp_path / "hf").exists()
  assert sorted(p.name for p in tmp_path.iterdir()) == ["pre_norm"]


@pytest.fixture(scope="module")
def opus_folder(tmp_path_factory):
  """A MarianMT folder in OPUS-MT's configuration, made here: swish, biases on every
  attention projection, a final logits bias, EOS 0 / unknown 1 / padding last, separate
  source and target SentencePiece models (trained on a few hundred lines) with one joint
  vocabulary. Randomly initialized, then trained by PyTorch for 300 steps on the copy
  task, so that its outputs end (a random model's never do) and depend on the source."""
  root = tmp_path_factory.mktemp("opus")
  files = copy_task_files(root, {"opus": 400}, seed=2)["opus"].split(",")
  pieces = set()
  for side, path in zip(("source", "target"), files):
    spm.SentencePieceTrainer.train(input=path, model_prefix=str(root / side), vocab_size=40,
                                   model_type="unigram", hard_vocab_limit=False,
                                   minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(root / f"{side}.model"))
    pieces |= {sp.id_to_piece(i) for i in range(sp.get_piece_size())}
  vocabulary = ["</s>", "<unk>"] + sorted(pieces - {"<s>", "</s>", "<unk>"}) + ["<pad>"]
  (root / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(vocabulary)}))
  pad = len(vocabulary) - 1
  config = transformers.MarianConfig(
      vocab_size=len(vocabulary), decoder_vocab_size=len(vocabulary), d_model=32,
      encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
      decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
      activation_function="swish", max_position_embeddings=64, scale_embedding=True,
      pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad, forced_eos_token_id=0,
      share_encoder_decoder_embeddings=True, tie_word_embeddings=True, dropout=0.0)
  torch.manual_seed(0)
  model = transformers.MarianMTModel(config)
  with torch.no_grad():  # A buffer, not trained: OPUS-MT's are not zero.
    model.final_logits_bias.normal_(0, 0.5)
  tokenizer = transformers.MarianTokenizer(
      source_spm=str(root / "source.model"), target_spm=str(root / "target.model"),
      vocab=str(root / "vocab.json"), source_lang="en", target_lang="xx")
  pairs = list(zip(*(open(path).read().splitlines() for path in files)))
  adam = torch.optim.Adam(model.parameters(), lr=3e-3)
  for step in range(300):
    batch = pairs[step * 32 % len(pairs):][:32]
    inputs = tokenizer([s for s, _ in batch], text_target=[t for _, t in batch],
                       return_tensors="pt", padding=True)
    inputs["labels"][inputs["labels"] == pad] = -100  # transformers' ignored label.
    adam.zero_grad()
    model(**inputs).loss.backward()
    adam.step()
  folder = root / "opus-mt-en-xx"
  model.eval().save_pretrained(folder)
  tokenizer.save_pretrained(folder)
  return str(folder), files


@pytest.mark.slow
def test_an_opus_mt_folder_imports_translates_as_transformers_and_exports_back(
    opus_folder, tmp_path):
  """import_model makes a run of it (the options it needs set); the run gives
  transformers' logits, greedy outputs and beam-4 n-best; its export is the folder's
  weights bit for bit; and it fine-tunes with its own config (configs/workdir.py)."""
  folder, (source_file, target_file) = opus_folder
  config = transformer_configs.get_config("numbers,smoke")
  config.data.update(task="text", train_files=f"{source_file},{target_file}",
                     eval_files=f"{source_file},{target_file}")
  config.train.update(num_eval_batches=1, max_length_buckets=1)
  workdir = str(tmp_path / "run")
  cfg = import_model.import_huggingface(folder, workdir, config)
  m = cfg.model
  assert (m.activation, m.attention_bias, m.logits_bias, m.layer_norm_epsilon) == (
      "swish", True, True, 1e-5)
  assert cfg.data.tokenizer_type == "marian" and cfg.data.target_lang == "xx"

  theirs, their_tok = _load(folder)
  trained = restore.load_workdir(workdir)
  params, step = restore.restore_params(trained)
  assert step == 0
  tok = trained.tokenizer
  to_ours = {marian: ours for ours, marian in enumerate(tok.marian_ids)}
  pad = theirs.config.pad_token_id
  sources = open(source_file).read().splitlines()[:24]
  targets = [s.upper() for s in sources]
  src, tgt = tok.encode(sources), tok.encode(targets, target=True)
  their_src = their_tok(sources)["input_ids"]
  assert [[to_ours[i] for i in row] for row in their_src] == src
  assert [[to_ours[i] for i in row] for row in their_tok(text_target=targets)["input_ids"]
          ] == tgt

  their_tgt = [[tok.marian_ids[i] for i in row] for row in tgt]
  logits = _their_logits(theirs, their_src, their_tgt, pad, pad)[..., tok.marian_ids]
  real = _padded(tgt) != PAD_ID
  off = np.abs(logits - _our_logits(trained, params, src, tgt))[real].max()
  print(f"imported logits {off:.2e} off transformers'")
  assert off <= 1e-4

  extra = 6
  as_ours = lambda rows: [[to_ours[i] for i in row] for row in rows]
  greedy = translation.translate_ids(params, trained.model, src,
                                     config_lib.DecodeConfig(beam_size=1, max_extra_length=extra))
  assert len(set(map(tuple, greedy))) > len(src) // 2
  assert as_ours(_their_search(theirs, their_src, pad, 1, extra)) == greedy
  beam = config_lib.DecodeConfig(beam_size=4, length_penalty=1.0, max_extra_length=extra,
                                 length_penalty_form="fairseq", finish_within_beam=True)
  ours_nbest = translation.translate_ids(params, trained.model, src, beam, nbest=4)
  their_nbest = _their_search(theirs, their_src, pad, 4, extra, alpha=1.0, nbest=4)
  _nbest_agree([[(as_ours([ids])[0], score) for ids, score in n] for n in their_nbest],
               ours_nbest, src, extra)

  exported = hf.export_huggingface(workdir, str(tmp_path / "back"))
  original = safetensors.numpy.load_file(os.path.join(folder, hf.WEIGHTS))
  again = safetensors.numpy.load_file(os.path.join(exported, hf.WEIGHTS))
  assert sorted(again) == sorted(original)
  for name, tensor in original.items():
    assert again[name].dtype == tensor.dtype and np.array_equal(again[name], tensor), name
  for name in ("source.spm", "target.spm"):
    assert open(os.path.join(exported, name), "rb").read() == open(
        os.path.join(folder, name), "rb").read()
  assert json.load(open(os.path.join(exported, "vocab.json"))) == json.load(
      open(os.path.join(folder, "vocab.json")))

  result = subprocess.run(
      [sys.executable, "-m", "transformer_jax.main", f"--config=configs/workdir.py:{workdir}",
       f"--workdir={workdir}", "--config.train.num_train_steps=3",
       "--config.train.checkpoint_every_steps=3"],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  tuned, step = restore.restore_params(restore.load_workdir(workdir))
  assert step == 3
  moved = [float(np.abs(np.asarray(a) - np.asarray(b)).max())
           for a, b in zip(jax.tree.leaves(tuned), jax.tree.leaves(params))]
  assert min(moved) > 0  # Every parameter trained, the biases and options' included.


def _interop_recipe() -> dict:
  """The fine-tuning code of docs/interop.md, run as written."""
  text = (pathlib.Path(ROOT) / "docs" / "interop.md").read_text()
  section = text.split("### Fine-tuning an export in transformers")[1]
  code = section.split("```python\n")[1].split("```")[0]
  namespace: dict = {}
  exec(code, namespace)
  return namespace


@pytest.mark.slow
def test_an_export_fine_tuned_in_transformers_as_interop_md_says_trains_as_the_run(
    trained_workdir, tmp_path):
  """docs/interop.md's recipe, run here: five Adam steps of transformers on the export
  and five of this project's train step, from the same weights on the same batches
  (dropout off; LayerNorm epsilon 1e-5 on both sides; Adam's epsilon 1e-4, so that
  rounding cannot flip near-zero steps), end with the same losses and parameters within
  ROUNDING_K times the control: this project's steps from weights one float32 ulp away.
  Leaving out any one of the recipe's three changes, they end far apart: the test can
  tell."""
  import torch.nn.functional as F
  from transformer_jax.inference import marian
  from transformer_jax.model.transformer import Transformer
  from transformer_jax.training import optimizer
  recipe = _interop_recipe()
  trained = restore.load_workdir(trained_workdir)
  folder = hf.export_huggingface(trained_workdir, str(tmp_path / "hf"))
  cfg = trained.cfg
  opt_cfg = dataclasses.replace(cfg.optimizer, epsilon=1e-4)
  model_cfg = dataclasses.replace(cfg.model, dropout_rate=0.0, layer_norm_epsilon=1e-5)
  model = Transformer(model_cfg)
  sources, references = corpora.corpus(cfg.data).split("eval")
  src = _padded(trained.tokenizer.encode(sources[:8]))
  tgt = _padded(trained.tokenizer.encode(references[:8], target=True))
  batches = [{"inputs": np.roll(src, i, 0), "targets": np.roll(tgt, i, 0)} for i in range(5)]
  tx, _ = optimizer.make_optimizer(opt_cfg, model_cfg.d_model)
  smoothing = cfg.train.label_smoothing

  @jax.jit
  def our_step(state, batch):
    return step_lib.train_step(state, batch, jax.random.key(0), model=model,
                               label_smoothing=smoothing)

  def ours(params):
    state, losses = step_lib.TrainState.create(apply_fn=model.apply, params=params, tx=tx), []
    for batch in batches:
      state, out = our_step(state, batch)
      losses.append(float(out.loss.compute()))
    return marian.marian_tensors(state.params, model_cfg, hf.marian_ids(trained.tokenizer)), \
        losses

  def theirs(leave_out: str = ""):
    theirs = transformers.MarianMTModel.from_pretrained(
        folder, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    saved = {"positions": [e.weight for e in (theirs.model.encoder.embed_positions,
                                               theirs.model.decoder.embed_positions)],
             "padding_idx": [theirs.model.shared, theirs.model.encoder.embed_tokens,
                             theirs.model.decoder.embed_tokens],
             "biases": [p for n, p in theirs.named_parameters() if n.endswith("proj.bias")]}
    recipe["as_this_project_trains"](theirs.train())
    if leave_out == "positions":
      for weight in saved["positions"]:
        weight.requires_grad_(True)
    elif leave_out == "padding_idx":
      for table in saved["padding_idx"]:
        table.padding_idx = PAD_ID
    elif leave_out == "biases":
      for bias in saved["biases"]:
        bias.requires_grad_(True)
    adam = torch.optim.Adam([p for p in theirs.parameters() if p.requires_grad], lr=1.0,
                            betas=(opt_cfg.beta1, opt_cfg.beta2), eps=opt_cfg.epsilon)
    schedule = torch.optim.lr_scheduler.LambdaLR(adam, recipe["paper_learning_rate"](
        model_cfg.d_model, opt_cfg.warmup_steps, opt_cfg.learning_rate_multiplier))
    losses = []
    for batch in batches:
      inputs, labels = (torch.tensor(batch[k]) for k in ("inputs", "targets"))
      labels = labels.masked_fill(labels == PAD_ID, -100)
      logits = theirs(input_ids=inputs, attention_mask=inputs != PAD_ID, labels=labels).logits
      loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100,
                             label_smoothing=smoothing)
      adam.zero_grad()
      loss.backward()
      adam.step()
      schedule.step()
      losses.append(loss.item())
    return {k: v.detach().numpy() for k, v in theirs.state_dict().items()}, losses

  def differences(a, b):
    (tensors, losses), (reference, reference_losses) = a, b
    return {"loss": max(map(relative_difference, losses, reference_losses)),
            "parameters": max(relative_difference(tensors[k], reference[k])
                              for k in reference)}

  params, _ = restore.restore_params(trained)
  reference = ours(params)
  control = differences(ours(jax.tree.map(lambda x: step_lib.perturb(x, 1), params)),
                        reference)
  assert_within_rounding(differences(theirs(), reference), control)
  for leave_out in ("positions", "padding_idx", "biases"):
    apart = differences(theirs(leave_out), reference)["parameters"]
    print(f"without {leave_out}: {apart:.3g}, {apart / control['parameters']:.0f} x control")
    assert apart > 100 * ROUNDING_K * control["parameters"], (leave_out, apart, control)


@pytest.mark.parametrize("form, alpha, expected", [
    ("gnmt", 0.6, 0.5),      # ((5 + |Y|) / 6)^0.6 ~ |Y|^0.5 around 25 subwords.
    ("gnmt", 1.2, 1.0),
    ("gnmt", 0.0, 0.0),
    ("fairseq", 0.6, 0.6),   # Already transformers' |Y|^a: as it is.
    ("fairseq", 1.0, 1.0),
])
def test_the_exports_generation_config_converts_the_penalty_and_forbids_padding(
    form, alpha, expected):
  """generation_config.json: transformers' length penalty |Y|^a from each
  decode.length_penalty_form (the paper's form converted at hf.TYPICAL_LENGTH, fairseq's
  as it is); the padding id (Marian's, whatever it is) never generated, only started
  from; EOS forced at the limit; the run's beam; a search to the end (Sec. 6.1's)."""
  cfg = config_lib.parse(transformer_configs.get_config("numbers"))
  cfg = dataclasses.replace(cfg, decode=dataclasses.replace(
      cfg.decode, length_penalty=alpha, length_penalty_form=form, beam_size=5))
  generation = hf.generation_config(cfg, pad=58, eos=3)
  assert generation["length_penalty"] == pytest.approx(expected, abs=1e-4)
  assert generation["bad_words_ids"] == [[58]]
  assert (generation["pad_token_id"], generation["decoder_start_token_id"]) == (58, 58)
  assert (generation["eos_token_id"], generation["forced_eos_token_id"]) == (3, 3)
  assert (generation["num_beams"], generation["early_stopping"]) == (5, "never")
  assert generation["max_length"] == min(cfg.model.max_len,
                                         cfg.data.max_length + cfg.decode.max_extra_length)
  read = transformers.GenerationConfig.from_dict(generation)  # As transformers reads it.
  assert (read.bad_words_ids, read.length_penalty) == ([[58]], generation["length_penalty"])


def test_every_name_transformers_has_for_an_activation_here_is_imported_as_it():
  """Every activation_function name of transformers' ACT2FN that computes one of
  model.activation's functions (over -20..20: a clipped variant does not) imports as
  that function (swish and silu both as swish); every other name is refused in one
  line naming it."""
  from transformers.activations import ACT2FN
  x = torch.linspace(-20.0, 20.0, 4001)
  ours = {"relu": torch.relu(x), "swish": torch.nn.functional.silu(x),
          "gelu": torch.nn.functional.gelu(x)}
  marian_config = {"scale_embedding": True, "d_model": 32, "encoder_layers": 1,
                   "decoder_layers": 1, "encoder_attention_heads": 4,
                   "decoder_attention_heads": 4, "encoder_ffn_dim": 64,
                   "decoder_ffn_dim": 64, "max_position_embeddings": 64}
  for name in ACT2FN:
    try:
      y = ACT2FN[name](x)
    except Exception:  # Needs parameters or another input: not one of ours.
      y = None
    same = [ours_name for ours_name, ref in ours.items()
            if y is not None and y.shape == x.shape and torch.allclose(y, ref, atol=1e-6)]
    config = {**marian_config, "activation_function": name}
    if same:
      assert hf.model_fields(config, {})["activation"] == same[0], name
    else:
      with pytest.raises(ValueError, match=f"activation_function={name!r}"):
        hf.model_fields(config, {})
  assert {"swish", "silu"} <= {n for n, a in hf.FROM_ACTIVATION.items() if a == "swish"}


@pytest.mark.parametrize("extra, max_length", [(20, 44), (16, 48), (10, 48)])
def test_an_import_shortens_data_max_length_to_what_its_positions_hold(
    opus_folder, tmp_path, extra, max_length):
  """64 positions hold a sentence of data.max_length plus decode.max_extra_length: with a
  margin of 20, the config's 48 becomes 44; with 16 it just fits; with 10 it stays."""
  config = transformer_configs.get_config("numbers")
  config.decode.max_extra_length = extra
  assert config.data.max_length == 48
  cfg = import_model.import_huggingface(opus_folder[0], str(tmp_path / "run"), config)
  assert cfg.model.max_len == 64
  assert cfg.data.max_length == max_length
  saved = config_lib.load_workdir_config(str(tmp_path / "run"))
  assert saved.data.max_length == max_length
