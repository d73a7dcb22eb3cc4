"""A step's time predicted from its compiled program (transformer_jax/planning/roofline.py):
each kernel's FLOPs and bytes read off the program, its category, and the floors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import smoke_config
from transformer_jax import config as config_lib, partitioning
from transformer_jax.model import transformer as model_lib
from transformer_jax.planning import roofline
from transformer_jax.training import run as run_lib

# A program as XLA compiles it for a GPU: a cuBLAS call returns (result, workspace), its
# contraction is in the backend config, and one XLA made itself carries no op_name.
GPU_PROGRAM = """HloModule jit_train_step

%fused_add (param_0: bf16[64,96]) -> bf16[64,96] {
  %param_0 = bf16[64,96]{1,0} parameter(0)
  ROOT %add.1 = bf16[64,96]{1,0} add(%param_0, %param_0), metadata={op_name="jit(train_step)/jvp(Transformer)/Transformer.encode/layers_0/ffn_norm/add"}
}

ENTRY %main.9 (x.1: bf16[64,32], w.1: bf16[32,96]) -> bf16[64,96] {
  %x.1 = bf16[64,32]{1,0} parameter(0), metadata={op_name="x"}
  %w.1 = bf16[32,96]{1,0} parameter(1), metadata={op_name="w"}
  %custom-call.1 = (bf16[64,96]{1,0}, s8[4194304]{0}) custom-call(%x.1, %w.1), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(train_step)/jvp(Transformer)/Transformer.encode/layers_0/self_attention/vmap(BNTS,BSNH->BTNH)/dot_general"}, backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}
  %get-tuple-element.1 = bf16[64,96]{1,0} get-tuple-element(%custom-call.1), index=0
  %custom-call.2 = (bf16[64,96]{1,0}, s8[4194304]{0}) custom-call(%get-tuple-element.1, %w.1), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["0"],"rhs_contracting_dimensions":["0"]}}}
  %get-tuple-element.2 = bf16[64,96]{1,0} get-tuple-element(%custom-call.2), index=0
  ROOT %loop_add_fusion = bf16[64,96]{1,0} fusion(%get-tuple-element.2), kind=kLoop, calls=%fused_add
}
"""


def test_a_products_flops_and_bytes_come_from_the_program():
  f = jax.jit(lambda x, w: jnp.tanh(x @ w))
  text = f.lower(jnp.ones((64, 128)), jnp.ones((128, 256))).compile().as_text()
  kernels = roofline.kernels(text)
  products = [k for k in kernels if k.flops]
  assert len(products) == 1 and products[0].flops == 2 * 64 * 128 * 256
  assert products[0].bytes == 4 * (64 * 128 + 128 * 256 + 64 * 256)  # Read once, written once.
  assert products[0].category == "matrix products"
  assert sum(k.flops for k in kernels) == 2 * 64 * 128 * 256


def test_a_library_calls_result_is_counted_not_its_workspace():
  first, second, add = roofline.kernels(GPU_PROGRAM)
  assert first.flops == 2 * 64 * 96 * 32  # Contracted over the left operand's dimension 1.
  assert second.flops == 2 * 64 * 96 * 64  # Over its dimension 0 (64), as configured.
  assert first.bytes == 2 * (64 * 32 + 32 * 96 + 64 * 96)  # No 4 MiB of scratch.
  assert first.category == "attention"
  assert second.category == "attention"  # No op_name: its operand's maker's.
  assert (add.category, add.flops, add.bytes) == ("normalization", 0, 2 * 2 * 64 * 96)


def test_the_floors_follow_the_bounds_and_add_up():
  kernels = roofline.kernels(GPU_PROGRAM)
  slow = roofline.predict(kernels, 1e9, 1e9)  # Both rates so low that no floor is 2 us.
  assert slow["step_ms"] == pytest.approx(sum(c["ms"] for c in slow["categories"].values()))
  assert sum(c["share"] for c in slow["categories"].values()) == pytest.approx(1.0)
  attention = slow["categories"]["attention"]
  assert attention["bound"] == "compute"  # 2 x 64 x 96 x 96 FLOPs > their bytes.
  faster = roofline.predict(kernels, 2e9, 1e9)["categories"]
  assert faster["attention"]["ms"] == pytest.approx(attention["ms"] / 2)
  assert faster["normalization"]["ms"] == slow["categories"]["normalization"]["ms"]
  fast = roofline.predict(kernels, 1e18, 1e18)
  assert fast["step_ms"] == pytest.approx(3 * roofline.MIN_KERNEL_S * 1e3)  # Launches.


def test_flash_attention_counts_the_papers_products_per_site():
  cfg = config_lib.ModelConfig(d_model=64, num_heads=4, num_encoder_layers=2,
                               num_decoder_layers=3)
  rows, src, tgt, d = 5, 12, 10, 16
  kernels = roofline.flash_attention(cfg, rows, src, tgt)
  assert len(kernels) == 2 * (2 + 2 * 3)  # Forward and backward a site.
  forward = [k.flops for k in kernels if not k.name.endswith("backward")]
  backward = [k.flops for k in kernels if k.name.endswith("backward")]
  qk_and_pv = lambda q, k: 2 * 2 * rows * 4 * q * k * d  # QK^T and PV (Sec. 3.2.1).
  assert forward == [qk_and_pv(src, src)] * 2 + [qk_and_pv(tgt, tgt) / 2,  # Causal.
                                                 qk_and_pv(tgt, src)] * 3
  assert backward == [2.5 * f for f in forward]
  assert all(k.category == "attention" for k in kernels)


# cuDNN's attention compiled for a GPU (model.attention_implementation="cudnn", cuDNN
# installed): Q, K, V [b, s, h, d] = [2, 16, 4, 8] into the fused call, beside a product.
CUDNN_PROGRAM = """HloModule jit_train_step

ENTRY %main.2 (q.1: bf16[2,16,4,8], x.1: bf16[64,32], w.1: bf16[32,96]) -> bf16[2,16,4,8] {
  %q.1 = bf16[2,16,4,8]{3,2,1,0} parameter(0), metadata={op_name="q"}
  %x.1 = bf16[64,32]{1,0} parameter(1), metadata={op_name="x"}
  %w.1 = bf16[32,96]{1,0} parameter(2), metadata={op_name="w"}
  %custom-call.1 = (bf16[64,96]{1,0}, s8[4194304]{0}) custom-call(%x.1, %w.1), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(train_step)/jvp(Transformer)/Transformer.encode/encoder_0/ffn/wi/dot_general"}, backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}
  %fmha.1 = (bf16[2,16,4,8]{3,2,1,0}, u8[0]{0}) custom-call(%q.1, %q.1, %q.1), custom_call_target="__cudnn$fmhaSoftmax", metadata={op_name="jit(train_step)/jvp(Transformer)/Transformer.encode/encoder_0/self_attention/dot_product_attention_fwd"}
  ROOT %out.1 = bf16[2,16,4,8]{3,2,1,0} get-tuple-element(%fmha.1), index=0
}
"""


def test_a_program_with_cudnns_attention_is_predicted_as_compiled():
  """Compiled with cuDNN's attention, a step's attention is the program's fused calls
  (QK^T and PV: 4 b h s s d FLOPs), not cuDNN's estimated in place of XLA's kernels."""
  cfg = config_lib.ModelConfig(d_model=32, num_heads=4, num_encoder_layers=1,
                               num_decoder_layers=1)
  got = roofline.for_gpu(CUDNN_PROGRAM, cfg, (2, 16), "H100", 989, 3350)
  assert "xla_attention_step_ms" not in got
  assert got["categories"]["attention"]["flops"] == 4.0 * 2 * 4 * 16 * 16 * 8
  assert got["categories"]["attention"]["kernels"] == 1
  assert got["categories"]["matrix products"]["flops"] == 2.0 * 64 * 32 * 96
  estimated = roofline.for_gpu(GPU_PROGRAM, cfg, (2, 16), "H100", 989, 3350)
  assert "xla_attention_step_ms" in estimated  # XLA's attention: cuDNN's estimated.
  assert estimated["categories"]["attention"]["kernels"] == 2 * 3  # Fwd, bwd; 3 sites.


def test_a_train_step_sorts_into_every_category_with_its_products_counted():
  """The smoke config's train step compiled on this CPU: every category but copies
  appears, and the matrix products add up to the paper's 6 x parameters per token."""
  cfg = smoke_config(vocab_size=64)
  mesh = partitioning.make_mesh((1, 1, 1), jax.devices()[:1])
  run, state = run_lib.make_run(cfg, mesh, abstract=True)
  rows, length = 8, 16
  batch = {k: jax.ShapeDtypeStruct((rows, length), jnp.int32,
                                   sharding=partitioning.batch_sharding(mesh))
           for k in ("inputs", "targets")}
  with run.activate():
    text = run.train_step.lower(state, batch, run.dropout_key).compile().as_text()
  kernels = roofline.kernels(text)
  found = {k.category for k in kernels}
  assert {"matrix products", "attention", "vocabulary loss", "embedding", "normalization",
          "dropout", "optimizer"} <= found, found
  params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
  expected = rows * length * model_lib.train_flops_per_target_token(cfg.model, params,
                                                                    length)
  counted = sum(k.flops for k in kernels)
  assert 0.8 * expected < counted < 1.25 * expected, (counted, expected)


def test_a_loops_kernels_count_once_a_trip():
  def f(x, w):
    return jax.lax.fori_loop(0, 5, lambda i, y: jnp.tanh(y @ w + i), x)
  text = jax.jit(f).lower(jnp.ones((64, 128)), jnp.ones((128, 128))).compile().as_text()
  assert " while(" in text  # Kept a loop, not unrolled.
  kernels = roofline.kernels(text)
  assert sum(k.flops for k in kernels) == 5 * 2 * 64 * 128 * 128
  assert max(k.runs for k in kernels) == 5
  once = jax.jit(lambda x, w: jnp.tanh(x @ w + 0)).lower(
      jnp.ones((64, 128)), jnp.ones((128, 128))).compile().as_text()
  product = lambda ks: next(k for k in ks if k.flops)
  assert product(kernels).bytes == 5 * product(roofline.kernels(once)).bytes  # Bytes too.
  launches = roofline.predict(kernels, 1e18, 1e18)  # Only the launch floor is left:
  assert launches["step_ms"] == pytest.approx(  # each of a trip's kernels, each trip.
      sum(k.runs for k in kernels) * roofline.MIN_KERNEL_S * 1e3)
  loops = roofline.containers(text)  # A trace's loop events enclose these kernels.
  assert loops and all(name.startswith("while") for name in loops)
  assert not loops & {k.name for k in kernels}


@pytest.mark.parametrize("op_names, expected", [
    ("jit(train_step)/jvp(Transformer)/Transformer.encode/layers_0/self_attention/query/"
     "dot_general", "matrix products"),  # A projection inside the attention block.
    ("jit(train_step)/transpose(jvp(Transformer))/Transformer.decode/layers_1/"
     "encoder_decoder_attention/out/dot_general", "matrix products"),
    ("jit(train_step)/jvp(Transformer)/Transformer.encode/layers_0/self_attention/"
     "vmap(BNTS,BSNH->BTNH)/dot_general", "attention"),  # Its scores' products are not.
    ("jit(train_step)/jvp(Transformer)/Transformer.encode/layers_0/self_attention/"
     "softmax/exp", "attention"),
    ("jit(train_step)/jvp(Transformer)/Transformer.encode/layers_0/ffn/wi/dot_general",
     "matrix products"),
])
def test_a_kernels_category_comes_from_its_own_operations_not_the_enclosing_block(
    op_names, expected):
  """The attention block's projections are matrix products: the scope they sit in is
  not what they do."""
  assert roofline.category(op_names, "fusion", flops=1e6 if "dot" in op_names else 0,
                           only_moves=False) == expected


def test_a_layers_slice_of_stacked_weights_counts_the_slice_not_the_stack():
  """Scanned layers (model.scan_layers) keep each parameter stacked over the layers: a
  trip reads its layer's slice and writes its layer's gradient into the stack in place.
  Counting the whole stack each trip had a scanned base at 177 ms against 26 unrolled."""
  layers, width = 6, 256
  layer = width * width * 4

  def scanned(ws, x):
    return jnp.sum(jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0])

  text = jax.jit(jax.grad(scanned)).lower(jnp.ones((layers, width, width)),
                                         jnp.ones((64, width))).compile().as_text()
  in_loop = [k for k in roofline.kernels(text) if k.runs == layers]
  assert sum(k.flops for k in in_loop) == 3 * layers * 2 * 64 * width * width
  assert max(k.bytes / k.runs for k in in_loop) < 3 * layer  # Never the stack of 6.


def test_an_operand_one_kernel_slices_several_times_counts_every_slice():
  """Three rows of one [6, 64, 32] operand read by one fusion: it reads the three
  slices (each once), not one of them and not the whole operand; and writes its result."""
  text = jax.jit(lambda x: jnp.tanh(x[0] + x[3] * x[5])).lower(
      jnp.ones((6, 64, 32))).compile().as_text()
  (kernel,) = roofline.kernels(text)
  row = 64 * 32 * 4
  assert kernel.bytes == 3 * row + row


# A scanned layer's trip as XLA compiles it for a GPU: the product reads its layer's
# weights out of the stack inside a library fusion, a slice runs asynchronously
# (fusion-start carries its operands in its result tuple; fusion-done is no kernel),
# and the gradient goes into the stack in place.
SCANNED_GPU_PROGRAM = """HloModule jit_train_step

%fused_slice (param_0: f32[6,64,32], param_1: s32[]) -> f32[1,64,32] {
  %param_0 = f32[6,64,32]{2,1,0} parameter(0)
  %param_1 = s32[] parameter(1)
  %constant.0 = s32[] constant(0)
  ROOT %dynamic-slice.1 = f32[1,64,32]{2,1,0} dynamic-slice(%param_0, %param_1, %constant.0, %constant.0), dynamic_slice_sizes={1,64,32}, metadata={op_name="jit(train_step)/Transformer.encode/while/body/dynamic_slice"}
}

%dynamic-slice-fusion (p0: bf16[6,32,96], p1: s32[], p2: bf16[64,32]) -> (bf16[64,96], s8[4194304]) {
  %p2 = bf16[64,32]{1,0} parameter(2)
  %p0 = bf16[6,32,96]{2,1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %constant.1 = s32[] constant(0)
  %dynamic-slice.2 = bf16[1,32,96]{2,1,0} dynamic-slice(%p0, %p1, %constant.1, %constant.1), dynamic_slice_sizes={1,32,96}
  %bitcast.1 = bf16[32,96]{1,0} bitcast(%dynamic-slice.2)
  ROOT %custom-call.1 = (bf16[64,96]{1,0}, s8[4194304]{0}) custom-call(%p2, %bitcast.1), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(train_step)/Transformer.encode/while/body/layer/ffn/wi/dot_general"}, backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}}}
}

%fused_update (param_0: bf16[6,64,96], param_1: bf16[64,96], param_2: s32[]) -> bf16[6,64,96] {
  %param_0 = bf16[6,64,96]{2,1,0} parameter(0)
  %param_1 = bf16[64,96]{1,0} parameter(1)
  %bitcast.2 = bf16[1,64,96]{2,1,0} bitcast(%param_1)
  %param_2 = s32[] parameter(2)
  %constant.2 = s32[] constant(0)
  ROOT %dynamic-update-slice.1 = bf16[6,64,96]{2,1,0} dynamic-update-slice(%param_0, %bitcast.2, %param_2, %constant.2, %constant.2), metadata={op_name="jit(train_step)/Transformer.encode/while/body/dynamic_update_slice"}
}

%body (state: (f32[6,64,32], bf16[6,32,96], bf16[64,32], bf16[6,64,96], s32[])) -> (f32[6,64,32], bf16[6,32,96], bf16[64,32], bf16[6,64,96], s32[]) {
  %state = (f32[6,64,32]{2,1,0}, bf16[6,32,96]{2,1,0}, bf16[64,32]{1,0}, bf16[6,64,96]{2,1,0}, s32[]) parameter(0)
  %stats = f32[6,64,32]{2,1,0} get-tuple-element(%state), index=0
  %w = bf16[6,32,96]{2,1,0} get-tuple-element(%state), index=1
  %x = bf16[64,32]{1,0} get-tuple-element(%state), index=2
  %acc = bf16[6,64,96]{2,1,0} get-tuple-element(%state), index=3
  %i = s32[] get-tuple-element(%state), index=4
  %fusion-start.1 = ((f32[6,64,32]{2,1,0}, s32[]), f32[1,64,32]{2,1,0}, u32[]) fusion-start(%stats, %i), kind=kLoop, calls=%fused_slice
  %fusion-done.1 = f32[1,64,32]{2,1,0} fusion-done(%fusion-start.1)
  %dynamic_slice_fusion = (bf16[64,96]{1,0}, s8[4194304]{0}) fusion(%w, %i, %x), kind=kCustom, calls=%dynamic-slice-fusion
  %product = bf16[64,96]{1,0} get-tuple-element(%dynamic_slice_fusion), index=0
  %loop_dynamic_update_slice_fusion = bf16[6,64,96]{2,1,0} fusion(%acc, %product, %i), kind=kLoop, calls=%fused_update
  ROOT %tuple.1 = (f32[6,64,32]{2,1,0}, bf16[6,32,96]{2,1,0}, bf16[64,32]{1,0}, bf16[6,64,96]{2,1,0}, s32[]) tuple(%stats, %w, %x, %loop_dynamic_update_slice_fusion, %i)
}

%cond (state.1: (f32[6,64,32], bf16[6,32,96], bf16[64,32], bf16[6,64,96], s32[])) -> pred[] {
  %state.1 = (f32[6,64,32]{2,1,0}, bf16[6,32,96]{2,1,0}, bf16[64,32]{1,0}, bf16[6,64,96]{2,1,0}, s32[]) parameter(0)
  ROOT %constant.3 = pred[] constant(true)
}

ENTRY %main.1 (start: (f32[6,64,32], bf16[6,32,96], bf16[64,32], bf16[6,64,96], s32[])) -> (f32[6,64,32], bf16[6,32,96], bf16[64,32], bf16[6,64,96], s32[]) {
  %start = (f32[6,64,32]{2,1,0}, bf16[6,32,96]{2,1,0}, bf16[64,32]{1,0}, bf16[6,64,96]{2,1,0}, s32[]) parameter(0)
  ROOT %while.1 = (f32[6,64,32]{2,1,0}, bf16[6,32,96]{2,1,0}, bf16[64,32]{1,0}, bf16[6,64,96]{2,1,0}, s32[]) while(%start), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"6"}}
}
"""


def test_a_scanned_layers_trip_on_a_gpu_moves_its_layers_bytes():
  kernels = {k.name: k for k in roofline.kernels(SCANNED_GPU_PROGRAM)}
  assert set(kernels) == {"fusion-start.1", "dynamic_slice_fusion",
                          "loop_dynamic_update_slice_fusion"}  # fusion-done: no kernel.
  trips = 6
  sliced, product, update = (kernels[n] for n in ("fusion-start.1", "dynamic_slice_fusion",
                                                  "loop_dynamic_update_slice_fusion"))
  assert sliced.runs == product.runs == update.runs == trips
  assert sliced.bytes == trips * (2 * 64 * 32 * 4 + 4)  # The slice read and written.
  assert product.flops == trips * 2 * 64 * 96 * 32  # A library product inside a fusion.
  assert product.bytes == trips * (32 * 96 * 2 + 64 * 32 * 2 + 4 + 64 * 96 * 2)
  assert product.category == "matrix products"
  assert update.bytes == trips * (2 * 64 * 96 * 2 + 4)  # The update in, the update out.


# train.loss_kernel="pallas" compiled for a GPU: three Pallas calls (Triton custom calls
# named by pallas_call(name=...)), h [1024, 32] by the embedding [128, 32].
PALLAS_PROGRAM = """HloModule jit_train_step

ENTRY %main.1 (h.1: bf16[1024,32], w.1: bf16[128,32], t.1: s32[1024], g.1: f32[1024]) -> (bf16[1024,32], bf16[128,32]) {
  %h.1 = bf16[1024,32]{1,0} parameter(0), metadata={op_name="h"}
  %w.1 = bf16[128,32]{1,0} parameter(1), metadata={op_name="w"}
  %t.1 = s32[1024]{0} parameter(2), metadata={op_name="t"}
  %g.1 = f32[1024]{0} parameter(3), metadata={op_name="g"}
  %pallas_call.6 = (f32[1024]{0}, f32[1024]{0}, f32[1024]{0}) custom-call(%h.1, %w.1, %t.1), custom_call_target="__gpu$xla.gpu.triton", operand_layout_constraints={bf16[1024,32]{1,0}, bf16[128,32]{1,0}, s32[1024]{0}}, api_version=API_VERSION_TYPED_FFI, metadata={op_name="jit(train_step)/jvp(loss)/vocabulary_loss_forward/pallas_call" scheduling_name="pallas_call.6"}
  %lse.1 = f32[1024]{0} get-tuple-element(%pallas_call.6), index=1
  %pallas_call.10 = bf16[1024,32]{1,0} custom-call(%h.1, %w.1, %t.1, %lse.1, %g.1, /*index=5*/%g.1), custom_call_target="__gpu$xla.gpu.triton", operand_layout_constraints={bf16[1024,32]{1,0}, bf16[128,32]{1,0}, s32[1024]{0}, f32[1024]{0}, f32[1024]{0}, f32[1024]{0}}, api_version=API_VERSION_TYPED_FFI, metadata={op_name="jit(train_step)/transpose(jvp(loss))/vocabulary_loss_grad_h/pallas_call" scheduling_name="pallas_call.10"}
  %pallas_call.11 = bf16[128,32]{1,0} custom-call(%h.1, %w.1, %t.1, %lse.1, %g.1, /*index=5*/%g.1), custom_call_target="__gpu$xla.gpu.triton", operand_layout_constraints={bf16[1024,32]{1,0}, bf16[128,32]{1,0}, s32[1024]{0}, f32[1024]{0}, f32[1024]{0}, f32[1024]{0}}, api_version=API_VERSION_TYPED_FFI, metadata={op_name="jit(train_step)/transpose(jvp(loss))/vocabulary_loss_grad_w/pallas_call" scheduling_name="pallas_call.11"}
  ROOT %tuple.1 = (bf16[1024,32]{1,0}, bf16[128,32]{1,0}) tuple(%pallas_call.10, %pallas_call.11)
}
"""


def test_the_fused_loss_kernels_count_their_products_and_every_result():
  """A Pallas call's FLOPs are not in the program: they come from its name and operand
  shapes (the kernels table, kernels/__init__.py: the forward's one product of h by the
  embedding, each gradient's two, the recomputed logits and its own), its bytes from
  every element of its result tuple, its category from its scope."""
  forward, grad_h, grad_w = roofline.kernels(PALLAS_PROGRAM)
  product = 2.0 * 1024 * 128 * 32
  assert (forward.flops, grad_h.flops, grad_w.flops) == (product, 2 * product, 2 * product)
  inputs = 2 * 1024 * 32 + 2 * 128 * 32 + 4 * 1024
  assert forward.bytes == inputs + 3 * 4 * 1024  # Its three statistics, not the first.
  assert grad_h.bytes == inputs + 3 * 4 * 1024 + 2 * 1024 * 32
  assert grad_w.bytes == inputs + 3 * 4 * 1024 + 2 * 128 * 32
  assert {k.category for k in (forward, grad_h, grad_w)} == {"vocabulary loss"}


def test_a_pallas_kernel_whose_flops_are_unknown_is_refused():
  """Counted as 0 FLOPs, an unknown kernel would make the floor look lower than it is."""
  with pytest.raises(ValueError, match="a Pallas kernel 'my_kernel' whose FLOPs"):
    roofline.kernels(PALLAS_PROGRAM.replace("vocabulary_loss_grad_h", "my_kernel"))
