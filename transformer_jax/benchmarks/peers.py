r"""This project's train step beside two peers', on the same batches in the same process.

  python -m transformer_jax.benchmarks.peers --config=configs/transformer.py:base \
      --config.model.dtype=bfloat16 --flax_wmt_dir=DIR [--steps=20] [--results=FILE]

The batches are the speed benchmark's (tokens per step and length mix as training draws
them, at newstest2014's lengths; `workload.py`), and each model has this config's
dimensions, vocabulary, dropout and label smoothing, in bfloat16:
  this project   its jitted train step (the speed benchmark's timing);
  flax_wmt       the Flax WMT example's own `train_step` (its train.py, models.py
                 and decode.py from --flax_wmt_dir, e.g. flax's sdist's examples/wmt;
                 pmapped over one device as it runs there; its input pipeline's imports
                 stood in for, since the step uses none of them);
  pytorch        torch.nn.Transformer with shared embeddings, sinusoidal positions,
                 autocast to bfloat16 and its scaled-dot-product attention, Adam as in
                 the paper; torch.compile'd first unless --notorch_compile (a compile
                 that fails falls back to eager, said in the figures).
Each is timed as the benchmark times steps: one step of each shape and --warmup_steps
more untimed, then --steps one by one; tokens/s counts real target tokens. A peer that
cannot run here (no --flax_wmt_dir, no torch) is skipped with one line. The figures go
to --results after each phase, with each peer's tokens/s and this project's ratio to it.
The Flax example's beam search is here too (`flax_wmt_translate`): `benchmark
--flax_wmt_dir` times it beside this project's.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import sys
import types
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from transformer_jax import cli, config as config_lib, partitioning
from transformer_jax.benchmarks import timing, workload
from transformer_jax.benchmarks.phases import now, Phases, provenance, report
from transformer_jax.data.tokenizer import EOS_ID
from transformer_jax.inference import translation
from transformer_jax.model.transformer import sinusoidal_position_encoding
from transformer_jax.training import compilation, run as run_lib

FLAGS = flags.FLAGS


def load_flax_wmt_module(wmt_dir: str, name: str) -> types.ModuleType:
  """The example's NAME.py, imported as flax_wmt_NAME."""
  spec = importlib.util.spec_from_file_location(f"flax_wmt_{name}",
                                                os.path.join(wmt_dir, f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load_flax_wmt(wmt_dir: str) -> types.ModuleType:
  """The example's train.py, with models and decode importable from `wmt_dir`; its data
  pipeline's modules (TensorFlow, input_pipeline, bleu, clu's writers) are stood in for
  while it is imported, and removed after."""
  tf = types.SimpleNamespace(data=types.SimpleNamespace(Dataset=None), io=None)
  stand_ins = {"tensorflow": tf,
               "input_pipeline": types.ModuleType("input_pipeline"),
               "bleu": types.ModuleType("bleu"), "clu": types.ModuleType("clu"),
               "clu.metric_writers": types.ModuleType("clu.metric_writers"),
               "clu.periodic_actions": types.ModuleType("clu.periodic_actions")}
  # Imported first, so that flax's own look for TensorFlow sees the real answer.
  importlib.import_module("flax.training.checkpoints")
  saved = {name: sys.modules.get(name) for name in [*stand_ins, "models", "decode"]}
  sys.path.insert(0, wmt_dir)
  try:
    sys.modules.update(stand_ins)
    return load_flax_wmt_module(wmt_dir, "train")
  finally:
    sys.path.remove(wmt_dir)
    for name, module in saved.items():
      if module is None:
        sys.modules.pop(name, None)
      else:
        sys.modules[name] = module


def flax_wmt_config(models: types.ModuleType, m: config_lib.ModelConfig, **fields):
  """The Flax WMT example's TransformerConfig (from its `models`) of `m`'s dimensions,
  embeddings shared as here, with `fields`."""
  if m.num_encoder_layers != m.num_decoder_layers:
    raise config_lib.InputError("--flax_wmt_dir: the Flax example has one num_layers for "
                                "both stacks.")
  return models.TransformerConfig(
      vocab_size=m.vocab_size, output_vocab_size=m.vocab_size, share_embeddings=True,
      logits_via_embedding=True, dtype=jnp.dtype(m.dtype), emb_dim=m.d_model,
      num_heads=m.num_heads, num_layers=m.num_encoder_layers, qkv_dim=m.d_model,
      mlp_dim=m.d_ff, max_len=m.max_len, **fields)


def flax_wmt_step(wmt_dir: str, cfg: config_lib.Config):
  """(step(batch), sync) of the Flax WMT example's train step at `cfg`'s dimensions."""
  from flax import jax_utils
  from flax import linen as nn
  from flax.training import common_utils
  import optax
  train = load_flax_wmt(wmt_dir)
  models, m = train.models, cfg.model
  config = flax_wmt_config(
      models, m, dropout_rate=m.dropout_rate, attention_dropout_rate=m.dropout_rate,
      deterministic=False, decode=False, kernel_init=nn.initializers.xavier_uniform(),
      bias_init=nn.initializers.normal(stddev=1e-6))
  ones = jnp.ones((1, cfg.data.max_length), jnp.float32)
  params = jax.jit(models.Transformer(config.replace(deterministic=True)).init)(
      jax.random.key(0), ones, ones)["params"]
  schedule = train.create_learning_rate_schedule(learning_rate=1e-3,
                                                 warmup_steps=cfg.optimizer.warmup_steps)
  state = jax_utils.replicate(train.TrainState.create(
      apply_fn=models.Transformer(config).apply, params=params,
      tx=optax.adamw(schedule, b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.0),
      dynamic_scale=None))
  p_step = jax.pmap(functools.partial(train.train_step, config=config,
                                      learning_rate_fn=schedule,
                                      label_smoothing=cfg.train.label_smoothing),
                    axis_name="batch", donate_argnums=(0,))
  rngs = jax.random.split(jax.random.key(1), jax.local_device_count())
  live = {"state": state}

  def step(batch):
    live["state"], live["metrics"] = p_step(live["state"], common_utils.shard(batch),
                                            dropout_rng=rngs)
  return step, lambda: jax.block_until_ready(live["metrics"])


def flax_wmt_translate(wmt_dir: str, model_cfg: config_lib.ModelConfig, decode_cfg,
                       sources: Sequence[Sequence[int]]) -> Callable[[], list]:
  """translate() -> outputs of the Flax WMT example's beam search (its own models.py and
  decode.py, loaded from `wmt_dir`, e.g. a flax checkout's examples/wmt) with a model
  of the same dimensions, random weights, on this project's decoding batches of
  `sources`: each batch's outputs limited to its width + decode.max_extra_length, as
  here."""
  try:
    models, decode = (load_flax_wmt_module(wmt_dir, n) for n in ("models", "decode"))
    config = flax_wmt_config(models, model_cfg, deterministic=True)
  except config_lib.InputError as e:
    cli.fail(str(e))
  except (FileNotFoundError, ImportError) as e:
    cli.fail(f"--flax_wmt_dir={wmt_dir}: cannot load its models.py and decode.py: {e}")
  predict_config = dataclasses.replace(config, decode=True)
  batches = list(translation.decode_batches(sources, model_cfg.max_len, decode_cfg))
  width = max(b.shape[1] for _, b in batches)
  params = models.Transformer(config).init(
      jax.random.key(0), jnp.ones((1, width), jnp.int32), jnp.ones((1, width), jnp.int32))
  params = params["params"]

  @functools.partial(jax.jit, static_argnums=(1,))
  def predict(inputs, max_decode_len):  # The example's predict_step (train.py).
    beam = decode_cfg.beam_size
    cache = models.Transformer(predict_config).init(
        jax.random.key(0), jnp.ones(inputs.shape, jnp.int32),
        jnp.ones((inputs.shape[0], max_decode_len), jnp.int32))["cache"]
    encoded = decode.flat_batch_beam_expand(models.Transformer(predict_config).apply(
        {"params": params}, inputs, method=models.Transformer.encode), beam)
    raw_inputs = decode.flat_batch_beam_expand(inputs, beam)
    def logits_fn(flat_ids, flat_cache):
      logits, new = models.Transformer(predict_config).apply(
          {"params": params, "cache": flat_cache}, encoded, raw_inputs, flat_ids,
          mutable=["cache"], method=models.Transformer.decode)
      return logits.squeeze(axis=1), new["cache"]
    seqs, _ = decode.beam_search(inputs, cache, logits_fn, beam_size=beam,
                                 alpha=decode_cfg.length_penalty, eos_id=EOS_ID,
                                 max_decode_len=max_decode_len)
    return seqs[:, -1, 1:]

  def translate():
    outputs = [None] * len(sources)
    for idx, batch in batches:
      result = np.asarray(predict(batch, batch.shape[1] + decode_cfg.max_extra_length))
      for i, ids in zip(idx, result):
        outputs[i] = [int(t) for t in ids[: list(ids).index(1)]] if 1 in ids else list(ids)
    return outputs
  return translate


def pytorch_step(cfg: config_lib.Config, compile_model: bool):
  """(step(batch), sync, how it ran) of torch.nn.Transformer at `cfg`'s dimensions on
  this machine's GPU (else its CPU), autocast to bfloat16; torch.compile'd if
  `compile_model`, falling back to eager if that fails at the first step."""
  torch = importlib.import_module("torch")  # Optional: `pip install -e '.[peers]'`.
  nn = torch.nn
  device = "cuda" if torch.cuda.is_available() else "cpu"
  m = cfg.model

  class Translator(nn.Module):
    def __init__(self):
      super().__init__()
      self.embed = nn.Embedding(m.vocab_size, m.d_model, padding_idx=0)
      nn.init.normal_(self.embed.weight, std=m.d_model ** -0.5)
      self.body = nn.Transformer(m.d_model, m.num_heads, m.num_encoder_layers,
                                 m.num_decoder_layers, m.d_ff, m.dropout_rate,
                                 batch_first=True)
      self.dropout = nn.Dropout(m.dropout_rate)
      self.register_buffer("positions", torch.as_tensor(  # The paper's (Sec. 3.5).
          sinusoidal_position_encoding(m.max_len, m.d_model)))

    def embedded(self, ids):
      x = self.embed(ids) * m.d_model ** 0.5 + self.positions[:ids.shape[1]]
      return self.dropout(x)

    def forward(self, inputs, targets):
      shifted = torch.nn.functional.pad(targets[:, :-1], (1, 0))  # BOS: the padding id.
      length = targets.shape[1]
      causal = torch.ones(length, length, dtype=torch.bool, device=targets.device).triu(1)
      states = self.body(self.embedded(inputs), self.embedded(shifted), tgt_mask=causal,
                         src_key_padding_mask=inputs == 0,
                         tgt_key_padding_mask=shifted == 0,
                         memory_key_padding_mask=inputs == 0, tgt_is_causal=True)
      return states @ self.embed.weight.T  # The shared pre-softmax projection.

  model = Translator().to(device)
  optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
  live = {"forward": torch.compile(model) if compile_model else model,
          "how": "torch.compile" if compile_model else "eager"}

  def logits_of(inputs, targets):
    try:
      return live["forward"](inputs, targets)
    except Exception as e:  # torch.compile compiles at the first call: eager measures.
      if live["forward"] is model:
        raise
      live.update(forward=model, how=f"eager (torch.compile failed: {e})"[:300])
      return model(inputs, targets)

  def step(batch):
    inputs = torch.as_tensor(batch["inputs"], device=device, dtype=torch.long)
    targets = torch.as_tensor(batch["targets"], device=device, dtype=torch.long)
    with torch.autocast(device, dtype=torch.bfloat16):
      logits = logits_of(inputs, targets)
    loss = torch.nn.functional.cross_entropy(
        logits.float().flatten(0, 1), targets.flatten(), ignore_index=0,
        label_smoothing=cfg.train.label_smoothing, reduction="sum")
    optimizer.zero_grad(set_to_none=True)
    (loss / (targets != 0).sum()).backward()
    optimizer.step()

  sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
  return step, sync, lambda: f"{live['how']} on {device}"


def with_ratios(rows: dict[str, dict]) -> dict[str, dict]:
  """Each measured row gets `ours_over_it`: this project's target tokens/s over its own
  (above 1: this project is faster)."""
  ours = rows.get("this project", {}).get("tokens_per_s")
  for row in rows.values():
    if ours and row.get("tokens_per_s"):
      row["ours_over_it"] = ours / row["tokens_per_s"]
  return rows


def main():
  report(compare, FLAGS.json)


def compare() -> dict:
  """This project's train step, then each peer's, on the same batches: the figures."""
  cfg = config_lib.with_vocab(config_lib.parse(FLAGS.config), FLAGS.config.data.vocab_size)
  lengths = workload.newstest_lengths(cfg.data.vocab_size, FLAGS.newstest_dir)
  data = workload.realistic_data(cfg.data.vocab_size, cfg.data.max_length, lengths,
                                 FLAGS.pairs)
  mesh = partitioning.make_mesh(cfg.train.mesh_shape, jax.devices()[:1])
  figures = {"config": " ".join(a for a in sys.argv[1:] if a.startswith("--config")),
             "provenance": provenance(), "started": now(), "peers": {}}
  phases = Phases(figures, FLAGS.results, FLAGS.budget_s)
  run, state = run_lib.make_run(cfg, mesh)
  batches = [run.train_batch(data, k) for k in range(FLAGS.warmup_steps + FLAGS.steps)]

  def ours():
    with compilation.count_compiles() as ahead:
      compilation.compile_ahead(compilation.train_programs(run, state,
                                                           timing.batch_shapes(batches)))
    with compilation.count_compiles() as later:
      _, timed = timing.benchmark_training(run, state, batches, data, FLAGS.steps,
                                           FLAGS.warmup_steps, FLAGS.peak_tflops)
    figures["recompiled"] = compilation.recompiled(ahead, later)
    figures["peers"]["this project"] = {k: timed[k] for k in ("step_s", "tokens_per_s",
                                                                "mfu")}
  phases.run("this project", ours)
  peers = {"flax_wmt": lambda: (*flax_wmt_step(FLAGS.flax_wmt_dir, cfg), lambda: "pmap"),
           "pytorch": lambda: pytorch_step(cfg, FLAGS.torch_compile)}
  missing = {"flax_wmt": not (FLAGS.flax_wmt_dir and os.path.exists(
                 os.path.join(FLAGS.flax_wmt_dir, "train.py"))) and
                 "no --flax_wmt_dir with the example's train.py",
             "pytorch": not importlib.util.find_spec("torch") and "torch is not installed"}
  for name, make in peers.items():
    if why := missing[name]:
      print(f"peer {name}: skipped ({why})")
      figures["peers"][name] = {"skipped": why}
      continue

    def measure(make=make, name=name):
      step, sync, how = make()
      timed = timing.time_steps(step, batches, FLAGS.steps, FLAGS.warmup_steps, sync)
      figures["peers"][name] = {**timed, "how": how()}
    phases.run(name, measure)
  for name, row in with_ratios(figures["peers"]).items():
    if "ours_over_it" in row:
      print(f"{name:14s} {row['tokens_per_s']:>12,.0f} target tokens/s, median step "
            f"{row['step_s'] * 1e3:.1f} ms; this project {row['ours_over_it']:.2f}x")
  return phases.end()


def define_flags() -> None:
  workload.define_flags()
  flags.DEFINE_integer("steps", 20, "Timed steps of each model.")
  flags.DEFINE_string("flax_wmt_dir", None, "The Flax WMT example's folder (train.py, "
                      "models.py, decode.py), e.g. flax's sdist's examples/wmt.")
  flags.DEFINE_bool("torch_compile", True, "torch.compile the PyTorch model first.")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
