"""Where a train step's time goes, predicted from its compiled program alone.

Every kernel of the optimized HLO (each fusion, library call and copy of the entry
computation and of the loops it runs) gets the FLOPs of the matrix products in it and
the bytes it must move (each operand read once, each output written once; of an operand
it only slices, the slice, and of a buffer it updates in place, the update), and a
category a reader knows, from the names JAX records for each operation (`op_name`: the
Flax module path, the step's named scopes). Its floor is the larger of FLOPs over the matrix rate and bytes
over the memory bandwidth, and at least `MIN_KERNEL_S` (a kernel launch). The sum of
the floors is a lower bound of the step, not a measurement; `step_profile` measures the
same categories from a trace of the step on the device.
"""

from __future__ import annotations

import collections
import dataclasses
import re

from transformer_jax import config as config_lib
from transformer_jax.kernels import products as pallas_products
from transformer_jax.model import attention

CATEGORIES = ("matrix products", "attention", "vocabulary loss", "embedding",
              "normalization", "dropout", "other element-wise", "optimizer",
              "copies and transposes")
MIN_KERNEL_S = 2e-6  # About the shortest kernel a GPU runs, launch included.

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
          "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_INSTRUCTION = re.compile(r"^\s*(ROOT )?%(\S+) = (.+?) ([a-z][a-z0-9\-]*)\((.*)$")
_ARRAY = re.compile(r"\b([a-z]+[0-9]*)\[([0-9,]*)\]")
_FREE = {"parameter", "get-tuple-element", "bitcast", "tuple", "constant", "after-all",
         "partition-id", "replica-id"}
_MOVES = {"copy", "transpose", "bitcast", "reshape", "broadcast", "slice", "concatenate",
          "pad", "parameter", "tuple", "get-tuple-element", "constant", "dynamic-slice",
          "dynamic-update-slice", "iota"}


@dataclasses.dataclass(frozen=True)
class Kernel:
  name: str  # The HLO instruction, e.g. "loop_add_fusion.3".
  opcode: str  # fusion, custom-call, copy, ...
  flops: float  # Of its matrix products (element-wise arithmetic is not counted).
  bytes: int  # Operands read once, outputs written once.
  category: str
  runs: int = 1  # Launches a step: a loop's kernels run once a trip.


@dataclasses.dataclass
class _Instruction:
  name: str
  shape: str
  opcode: str
  operands: list[str]
  attributes: str
  root: bool = False  # Its computation's result.
  parameter: int | None = None  # A parameter's number.


def _arrays(shape: str) -> list[tuple[str, list[int]]]:
  return [(dtype, [int(d) for d in dims.split(",") if d])
          for dtype, dims in _ARRAY.findall(shape) if dtype in _BYTES]


def _size(shape: str) -> int:
  """Bytes of a shape, a tuple's summed."""
  total = 0
  for dtype, dims in _arrays(shape):
    n = _BYTES[dtype]
    for d in dims:
      n *= d
    total += n
  return total


def _split_operands(rest: str) -> tuple[list[str], str]:
  """`%a, %b), attr=...` -> (["a", "b"], "attr=...")."""
  depth, end = 1, len(rest)
  for i, c in enumerate(rest):
    depth += {"(": 1, ")": -1}.get(c, 0)
    if depth == 0:
      end = i
      break
  return re.findall(r"%([^\s,()]+)", rest[:end]), rest[end + 1:]


def _computations(text: str) -> tuple[dict[str, list[_Instruction]], str]:
  """Every computation's instructions, by name, and the entry computation's name."""
  computations, current, entry = {}, None, ""
  for line in text.splitlines():
    header = re.match(r"^(ENTRY )?%(\S+) \(", line)
    if header and line.rstrip().endswith("{"):
      current = computations.setdefault(header.group(2), [])
      entry = header.group(2) if header.group(1) else entry
      continue
    if line.startswith("}"):
      current = None
      continue
    if current is not None and (m := _INSTRUCTION.match(line)):
      operands, attributes = _split_operands(m.group(5))
      number = re.match(r"(\d+)\)", m.group(5)) if m.group(4) == "parameter" else None
      current.append(_Instruction(*m.group(2, 3, 4), operands, attributes,
                                  root=bool(m.group(1)),
                                  parameter=int(number.group(1)) if number else None))
  return computations, entry


def _dot_flops(instruction: _Instruction, shapes: dict[str, str], contracting: list[int]
               ) -> float:
  """2 x output elements x the contracted size of the left operand."""
  out = _arrays(instruction.shape)
  if not out or not instruction.operands:
    return 0.0
  lhs = _arrays(shapes.get(instruction.operands[0], ""))
  if not lhs:
    return 0.0
  k = 1
  for d in contracting:
    k *= lhs[0][1][d]
  n = 1
  for d in out[0][1]:
    n *= d
  return 2.0 * n * k


def _attention_flops(instruction: _Instruction, shapes: dict[str, str], target: str
                     ) -> float:
  """QK^T and PV forward (4 b h sq sk d), 2.5 times that backward, half under a causal
  mask."""
  (_, q), (_, k) = (_arrays(shapes.get(o, ""))[0] for o in instruction.operands[:2])
  b, sq, h, d = q
  forward = 4.0 * b * h * sq * k[1] * d
  causal = 0.5 if re.search(r'"mask_type":"CAUSAL', instruction.attributes) else 1.0
  return forward * causal * (2.5 if "Backward" in target else 1.0)


PALLAS_TARGET = "__gpu$xla.gpu.triton"  # A Pallas kernel (Triton backend) on a GPU.


def pallas_kernel_name(instruction: _Instruction) -> str:
  """The `name` a Pallas call was given (pallas_call(name=...)), from its op_name."""
  m = re.search(r'op_name="[^"]*?([A-Za-z0-9_]+)/pallas_call', instruction.attributes)
  return m.group(1) if m else ""


def _pallas_flops(instruction: _Instruction, shapes: dict[str, str]) -> float:
  """The FLOPs of this project's Pallas kernels, from their names and operand shapes
  (a custom call's FLOPs are not in the program). A kernel not known here is refused:
  counted as 0 FLOPs it would make the floor look lower than it is."""
  name, known = pallas_kernel_name(instruction), pallas_products()
  if name not in known:
    raise ValueError(f"{instruction.name}: a Pallas kernel {name!r} whose FLOPs "
                     "planning/roofline.py does not know")
  if not known[name]:
    return 0.0
  (_, (rows, d)), (_, (vocab, _)) = (_arrays(shapes[o])[0] for o in instruction.operands[:2])
  return known[name] * 2.0 * rows * vocab * d


def _contracting(attributes: str) -> list[int]:
  m = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", attributes)
  if m:
    return [int(d) for d in m.group(1).split(",") if d]
  m = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', attributes)
  return [int(d) for d in re.findall(r"[0-9]+", m.group(1))] if m else []


def _op_names(instructions: list[_Instruction]) -> str:
  return " ".join(m for i in instructions for m in re.findall(r'op_name="([^"]*)"',
                                                                 i.attributes))


# Comparisons and logic: masks (an index's bounds, padding, a causal mask) that XLA fuses
# into whichever kernel uses them; they do not make that kernel their producer's.
_MASK_OP = re.compile(r"/(lt|le|gt|ge|eq|ne|and|or|not)$")


def category(op_names: str, opcode: str, flops: float, only_moves: bool) -> str:
  """The category of a kernel, from the `op_name`s of the operations in it (its masks'
  aside)."""
  op_names = " ".join(n for n in op_names.split() if not _MASK_OP.search(n))
  if re.search(r"\boptimizer/", op_names):
    return "optimizer"
  if "Transformer.project" in op_names or re.search(r"\bloss[/)]", op_names):
    return "vocabulary loss"
  if "_embedder/embed" in op_names or ("scatter" in opcode + op_names and
                                        "take_along_axis" not in op_names):
    return "embedding"
  if "fmha" in opcode or ("attention/" in op_names and re.search(
      r"BNTS|BTNH,BSNH|softmax|attention/vmap\(\)", op_names)):
    return "attention"
  if flops:
    return "matrix products"
  if only_moves:
    return "copies and transposes"
  if re.search(r"Dropout|rng_bit_generator|threefry|_bernoulli", op_names):
    return "dropout"
  if "_norm/" in op_names:
    return "normalization"
  return "other element-wise"


def kernels(hlo_text: str) -> list[Kernel]:
  """The kernels of a compiled program (`compiled.as_text()`), in program order: the
  entry computation's, and those of the loops, calls and branches it runs (a loop's
  kernels counted once for each of its known trips)."""
  computations, entry = _computations(hlo_text)
  shapes = {i.name: i.shape for body in computations.values() for i in body}
  producers = {i.name: i for body in computations.values() for i in body}
  out, named = [], {}

  def walk(computation: str, runs: int) -> None:
    for instruction in computations.get(computation, []):
      if instruction.opcode in ("while", "call", "conditional"):
        trips = re.search(r'"known_trip_count":\{"n":"([0-9]+)"', instruction.attributes)
        branches = re.search(r"branch_computations=\{([^}]*)\}", instruction.attributes)
        called = [*re.findall(r"(?:condition|body|to_apply)=%([^\s,]+)",
                              instruction.attributes),
                  *re.findall(r"%([^\s,]+)", branches.group(1) if branches else "")]
        for name in called:
          walk(name, runs * (int(trips.group(1)) if trips else 1))
      elif instruction.opcode not in _FREE and not instruction.opcode.endswith("-done"):
        out.append(_kernel(instruction, computations, shapes, producers, named, runs))

  walk(entry, 1)
  return out


def containers(hlo_text: str) -> set[str]:
  """The loops, calls and branches of a program: a trace times each around the kernels
  it runs, so their time is their kernels' (and the gaps between them)."""
  computations, _ = _computations(hlo_text)
  return {i.name for body in computations.values() for i in body
          if i.opcode in ("while", "call", "conditional")}


def _kernel(instruction: _Instruction, computations: dict[str, list[_Instruction]],
            shapes: dict[str, str], producers: dict[str, _Instruction],
            named: dict[str, str], runs: int) -> Kernel:
  called = re.search(r"calls=%([^\s,]+)", instruction.attributes)
  body = computations.get(called.group(1), []) if called else []
  local = collections.ChainMap({i.name: i.shape for i in body}, shapes)  # Names repeat.
  flops = sum(_dot_flops(i, local, _contracting(i.attributes)) for i in body
              if i.opcode in ("dot", "convolution") or _is_product(i))
  target = re.search(r'custom_call_target="([^"]+)"', instruction.attributes)
  opcode = instruction.opcode + (f" {target.group(1)}" if target else "")
  if instruction.opcode == "dot" or _is_product(instruction):
    flops += _dot_flops(instruction, shapes, _contracting(instruction.attributes))
  if target and "fmha" in target.group(1):  # cuDNN's attention: Q, K [b, s, h, d].
    flops += _attention_flops(instruction, shapes, target.group(1))
  if target and target.group(1) == PALLAS_TARGET:
    flops += _pallas_flops(instruction, shapes)
  moved = _written(instruction, body) + _read(instruction, body, shapes)
  only_moves = (instruction.opcode in _MOVES or
                bool(body) and all(i.opcode in _MOVES for i in body))
  names = _op_names([instruction, *body]) or _inherited(instruction, producers, named)
  named[instruction.name] = names
  return Kernel(instruction.name, opcode, runs * flops, runs * moved,
                category(names, opcode, flops, only_moves), runs)


def _is_product(instruction: _Instruction) -> bool:
  """A matrix product by a library (cuBLAS, cuBLASLt), alone or inside a fusion."""
  target = re.search(r'custom_call_target="([^"]+)"', instruction.attributes)
  return bool(target) and ("matmul" in target.group(1) or "gemm" in target.group(1))


def _written(instruction: _Instruction, body: list[_Instruction]) -> int:
  """Bytes a kernel writes: its result, without a library call's workspace; an
  asynchronous start's, its computation's result (not the tuple of operands it
  carries); into a buffer updated in place (dynamic-update-slice: a layer's gradient
  into the stacked layers'), the update only."""
  root = next((i for i in body if i.root), None)
  if root is not None and root.opcode == "dynamic-update-slice":
    return _size(next(i.shape for i in body if i.name == root.operands[1]))
  if root is not None and (instruction.opcode.endswith("-start") or _is_product(root)):
    instruction = root
  shape = instruction.shape
  if ("custom_call_target" in instruction.attributes and shape.startswith("(") and
      PALLAS_TARGET not in instruction.attributes):  # A Pallas call's tuple is its results;
    shape = _ARRAY.search(shape).group(0)  # a library's is (result, workspace).
  return _size(shape)


def _read(instruction: _Instruction, body: list[_Instruction], shapes: dict[str, str]
          ) -> int:
  """Bytes a kernel reads: each operand once; of an operand its computation only
  slices (a layer's weights out of the stacked layers), the slices; of the buffer that
  a dynamic-update-slice updates in place, nothing."""
  parameters = {i.parameter: i.name for i in body if i.opcode == "parameter"}
  total = 0
  for number, operand in enumerate(instruction.operands):
    users = [i for i in body if parameters.get(number) in i.operands]
    if users and all(i.operands[0] == parameters[number] for i in users):
      if all(i.opcode == "dynamic-update-slice" for i in users):
        continue
      if all(i.opcode in ("dynamic-slice", "slice") for i in users):
        total += sum(_size(i.shape) for i in users)
        continue
    total += _size(shapes.get(operand, ""))
  return total


def _inherited(instruction: _Instruction, producers: dict[str, _Instruction],
               named: dict[str, str]) -> str:
  """The op_names of the kernel that made the first operand, through bitcasts and tuple
  elements: a library call XLA created itself (a batched product of attention's
  backward pass, say) carries none of its own."""
  for operand in instruction.operands:
    while operand in producers and operand not in named and producers[operand].operands:
      operand = producers[operand].operands[0]
    if named.get(operand):
      return named[operand]
  return ""


def flash_attention(cfg: config_lib.ModelConfig, rows: int, source_len: int,
                    target_len: int) -> list[Kernel]:
  """cuDNN's fused attention as a floor, for a program compiled where cuDNN is not (a
  compile-only GPU): per attention site a forward kernel (two products, 4 B h Sq Sk d
  FLOPs, half of it under the causal mask) and a backward one (five products, 2.5 times
  the forward's), each reading and writing its [rows, length, h, d] arrays once in
  bfloat16, with its float32 softmax statistics."""
  heads, d = cfg.num_heads, cfg.key_dim or cfg.d_model // cfg.num_heads
  sites = ([("encoder", source_len, source_len, 1.0)] * cfg.num_encoder_layers +
           [("decoder self", target_len, target_len, 0.5),
            ("decoder cross", target_len, source_len, 1.0)] * cfg.num_decoder_layers)
  out = []
  for i, (name, q, k, part) in enumerate(sites):
    forward = 4.0 * rows * heads * q * k * d * part
    array = lambda n: 2 * rows * n * heads * d
    stats = 4 * rows * heads * q
    out += [Kernel(f"cudnn attention {i} ({name})", "custom-call cudnn fmha (analytic)",
                   forward, 2 * array(q) + 2 * array(k) + stats, "attention"),
            Kernel(f"cudnn attention {i} ({name}) backward",
                   "custom-call cudnn fmha backward (analytic)", 2.5 * forward,
                   4 * array(q) + 4 * array(k) + stats, "attention")]
  return out


def with_flash_attention(program: list[Kernel], cfg: config_lib.ModelConfig, rows: int,
                         source_len: int, target_len: int) -> list[Kernel]:
  """`program` with its attention kernels (XLA's) replaced by cuDNN's, as a GPU that has
  cuDNN runs it (model.attention_implementation='cudnn')."""
  return ([k for k in program if k.category != "attention"] +
          flash_attention(cfg, rows, source_len, target_len))


def predict(program: list[Kernel], flops_per_s: float, bytes_per_s: float) -> dict:
  """Per category: kernels, FLOPs, bytes and the floor in ms (with which bound held most
  of it); and the step's total."""
  rows = {c: collections.Counter() for c in CATEGORIES}
  for k in program:
    compute, memory = k.flops / flops_per_s, k.bytes / bytes_per_s
    row = rows[k.category]
    row.update(kernels=k.runs, flops=k.flops, bytes=k.bytes,
               ms=1e3 * max(compute, memory, k.runs * MIN_KERNEL_S),
               compute_ms=1e3 * compute, memory_ms=1e3 * memory)
  total = sum(r["ms"] for r in rows.values())
  return {"flops_per_s": flops_per_s, "bytes_per_s": bytes_per_s, "step_ms": total,
          "categories": {c: {"kernels": int(r["kernels"]), "flops": float(r["flops"]),
                             "bytes": int(r["bytes"]), "ms": float(r["ms"]),
                             "share": r["ms"] / total if total else 0.0,
                             "bound": "compute" if r["compute_ms"] > r["memory_ms"]
                             else "memory"}
                         for c, r in rows.items()}}


# The two ceilings as measured on this kind of machine (a bfloat16 8192^3 matrix product
# on random data; a device-to-device copy, bytes read plus written): the device tool's
# readings on the lent H100 (2026-11-13) and H200 (2026-11-04). The GPU suite measures
# them again in the same call as the step it breaks down.
MEASURED_RATES = {"H100": (798e12, 3.0e12), "H200": (788e12, 4.3e12)}


def for_gpu(hlo_text: str, cfg: config_lib.ModelConfig, batch: tuple[int, int],
            model: str, peak_tflops: float, hbm_gbps: float) -> dict:
  """The prediction for a train step compiled for one GPU of `model` (a key of
  topology.GPUS) on a batch of `batch` = (rows, length) on both sides, with cuDNN's
  attention (how the GPU suite trains): as compiled where the program has a fused
  attention's kernels (an implementation's `compiled_as`), else XLA's attention
  kernels replaced by cuDNN's estimated (`flash_attention`), with the total of XLA's."""
  flops_per_s, bytes_per_s = MEASURED_RATES.get(model, (peak_tflops * 1e12,
                                                        hbm_gbps * 1e9))
  program = kernels(hlo_text)
  rows, length = batch
  fused = [i.compiled_as for i in attention.implementations().values() if i.compiled_as]
  if any(marker in k.opcode for marker in fused for k in program):
    out = predict(program, flops_per_s, bytes_per_s)
  else:
    out = predict(with_flash_attention(program, cfg, rows, length, length), flops_per_s,
                  bytes_per_s)
    out["xla_attention_step_ms"] = predict(program, flops_per_s, bytes_per_s)["step_ms"]
  out["batch"] = [rows, length]
  out["pallas_calls"] = sum(PALLAS_TARGET in k.opcode for k in program)
  return out


def describe(prediction: dict) -> list[str]:
  lines = [f"predicted floor of a step: {prediction['step_ms']:.2f} ms (matrix rate "
           f"{prediction['flops_per_s'] / 1e12:.0f} TFLOP/s, memory "
           f"{prediction['bytes_per_s'] / 1e12:.2f} TB/s, {MIN_KERNEL_S * 1e6:.0f} us a "
           "kernel at least)",
           f"  {'category':24s} {'kernels':>7s} {'GFLOP':>8s} {'GB':>7s} {'ms':>7s} "
           f"{'share':>6s}  bound"]
  for name, row in prediction["categories"].items():
    lines.append(f"  {name:24s} {row['kernels']:7d} {row['flops'] / 1e9:8.1f} "
                 f"{row['bytes'] / 1e9:7.2f} {row['ms']:7.2f} {100 * row['share']:5.1f}%  "
                 f"{row['bound']}")
  return lines
