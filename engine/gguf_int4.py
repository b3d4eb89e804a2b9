"""The GGUF's own 4-bit weights as the engine's int4 layers: llama.cpp's weights, not a second rounding.

`quant="int4"` re-quantises weights that were first dequantised from the GGUF to bf16, so its int4 target
is a third model (neither the bf16 target nor llama.cpp's). `quant="gguf-int4"` reads the file itself:
every Q4_K matrix becomes an `Int4Linear` whose groups of 32 carry the file's 4-bit values, with the
kernel's (scale, zero) set so that its dequantisation (q - 8) * scale + zero equals Q4_K's
(d * sc) * q - dmin * m. Every other matrix type (Q6_K in Q4_K_M files: attn_v and ffn_down of about
half the layers, the output head; Q5_0 / Q8_0 in small models) is dequantised by the `gguf` package and
kept dense in the activation dtype. Embeddings, norms and biases are dequantised the same way.

What stays different from llama.cpp: the kernel holds scale and zero in the activation dtype (bf16 rounds
d * sc to 8 significant bits; fp32 keeps it exact), and llama.cpp rounds activations to 8 bits (Q8_K) for
its dot products, which a bf16 / fp32 activation path does not.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, ReaderTensor
from gguf.quants import dequantize, quantize
from torch import Tensor, nn

from engine.bundled import BUNDLED
from engine.config import ModelArgs
from engine.cpu_kernels import gguf_mm
from engine.cpu_kernels.layer import native_layer
from engine.cpu_kernels.linear import GgufKernelLinear, SubsetHead
from engine.cpu_kernels.pack import (
    PackCache,
    PackedMatrix,
    concat_packed,
    pack_q4_0,
    pack_q4k,
    pack_q6k,
    pack_q8_0,
)
from engine.gguf_file import read_gguf
from engine.model import Block, Transformer, rope_tables
from engine.models import Log, cache_root, log_to_stderr, resolve_gguf
from engine.q4k import Q4KGroups, concat_rows, unpack_q4k
from engine.quant import GGUF_A8, GGUF_INT4, Int4Linear, QuantMode, check_device

# The matrix types the engine's own CPU kernels take as they are (quant "gguf-a8"), and their packing.
PACKERS = {
    GGMLQuantizationType.Q4_K: pack_q4k,
    GGMLQuantizationType.Q6_K: pack_q6k,
    GGMLQuantizationType.Q4_0: pack_q4_0,
    GGMLQuantizationType.Q8_0: pack_q8_0,
}

# Architectures whose GGUF conversion keeps the Hugging Face row order of q and k (llama's permutes them).
GGUF_INT4_ARCHITECTURES = ("qwen2",)


def kernel_runs(gguf: Path) -> bool:
    """Whether the native backend can hold this GGUF's target on the engine's kernel (its architecture
    keeps Hugging Face's q/k row order); other files run on llama.cpp's kernels there."""
    return read_gguf(gguf).architecture in GGUF_INT4_ARCHITECTURES


def gguf_file_of(name_or_path: str, log: Log = log_to_stderr) -> Path:
    """The GGUF file behind a bundled name or a .gguf path; ValueError for a model that has none."""
    if name_or_path in BUNDLED or Path(name_or_path).suffix == ".gguf":
        return resolve_gguf(name_or_path, log=log)
    raise ValueError(
        f"quant {GGUF_INT4!r} loads the 4-bit weights of a GGUF file, and {name_or_path!r} is not one: give "
        "a bundled name or a .gguf file, or use quant 'int4' (re-quantises the checkpoint's weights)"
    )


class ConcatLinear(nn.Module):
    """Layers of one input side by side: y = cat([part(x) for part in parts], -1) + bias.

    For a fused projection whose pieces have different GGUF types (q and k Q4_K as int4, v Q6_K dense).
    """

    def __init__(self, parts: list[nn.Module], bias: Tensor | None) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        y = torch.cat([part(x) for part in self.parts], dim=-1)  # [..., sum of N]
        return y if self.bias is None else y + self.bias


class GgufTensors:
    """The tensors of one GGUF file by name, as the engine wants them."""

    def __init__(self, path: Path) -> None:
        self.file = read_gguf(Path(path))
        self.by_name: dict[str, ReaderTensor] = {t.name: t for t in self.file.tensors}
        self.pack_cache = PackCache.for_file(Path(path), cache_root() / "packed")

    @property
    def architecture(self) -> str:
        return self.file.architecture

    def __contains__(self, name: str) -> bool:
        return name in self.by_name

    def tensor(self, name: str) -> ReaderTensor:
        if name not in self.by_name:
            raise ValueError(f"the GGUF file {self.file.path} has no tensor {name!r}")
        return self.by_name[name]

    def matrix_shape(self, name: str) -> tuple[int, int]:
        """[N, K] (ggml lists a matrix's dimensions innermost first: K, N)."""
        k, n = (int(d) for d in self.tensor(name).shape)
        return n, k

    def is_q4k(self, name: str) -> bool:
        return self.tensor(name).tensor_type == GGMLQuantizationType.Q4_K

    def q4k(self, name: str) -> Q4KGroups:
        n, k = self.matrix_shape(name)
        return unpack_q4k(self.tensor(name).data, n, k)

    def packed(self, name: str) -> PackedMatrix:
        """A Q4_K, Q6_K, Q4_0 or Q8_0 matrix in the engine kernels' layout (engine/cpu_kernels/pack.py)."""
        n, k = self.matrix_shape(name)
        pack = PACKERS[self.tensor(name).tensor_type]
        return self.pack_cache.get(name, lambda: pack(self.tensor(name).data, n, k))

    def kernel_form(self, name: str) -> str:
        """How quant "gguf-a8" holds a matrix: its type's name (Q4_K, Q6_K, Q4_0, Q8_0) on the engine's
        kernels where its shape allows (K in 256s for K-quants, in 32s else; N in 16s), else 'dense'."""
        tensor = self.tensor(name)
        if len(tensor.shape) != 2:
            return "dense"
        n, k = self.matrix_shape(name)
        block = 256 if tensor.tensor_type in (GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K) else 32
        if tensor.tensor_type in PACKERS and k % block == 0 and n % 16 == 0:
            return str(tensor.tensor_type.name)
        return "dense"

    def dense(self, name: str, dtype: torch.dtype) -> Tensor:
        """Any tensor dequantised by gguf (float32), then cast to `dtype`: [N, K] or [K]."""
        source = self.tensor(name)
        values = np.asarray(dequantize(source.data, source.tensor_type), dtype=np.float32)
        return torch.from_numpy(values.copy()).to(dtype)


class GgufEmbedding(nn.Module):
    """The token embedding as the file keeps it (Q4_K rows in Q4_K_M files: 131 MB for the 1.5B target
    against 933 MB in fp32), each looked-up row dequantised by gguf as `dense` would be: the same values.

    The rows of the last CACHED_ROWS ids looked up one at a time are kept dequantised: gguf's numpy
    dequantisation costs ~0.2 ms a call, 4% of a draft step on the native kernels."""

    CACHED_ROWS = 2048  # ~7 MB of 896-wide rows (the 0.5B), ~12 MB of 1536-wide ones (the 1.5B)

    rows: Tensor  # [V, bytes a row] uint8

    def __init__(self, source: ReaderTensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.kind = source.tensor_type
        rows = np.array(source.data, copy=True).view(np.uint8)  # a copy: the file is mapped read-only
        self.register_buffer("rows", torch.from_numpy(rows))
        self.dtype = dtype
        self._recent: OrderedDict[int, Tensor] = OrderedDict()  # id -> [dim] in dtype

    def forward(self, tokens: Tensor) -> Tensor:
        if tokens.numel() == 1:
            return self._one(int(tokens.reshape(-1)[0])).reshape(*tokens.shape, -1)
        return self._dequantised(tokens.reshape(-1).cpu()).reshape(*tokens.shape, -1)

    def _dequantised(self, ids: Tensor) -> Tensor:
        picked = self.rows[ids].numpy()  # [T, bytes a row]
        values = np.asarray(dequantize(picked, self.kind), dtype=np.float32)  # [T, dim]
        return torch.from_numpy(values).to(self.dtype)

    def _one(self, token: int) -> Tensor:
        row = self._recent.get(token)
        if row is None:
            row = self._dequantised(torch.tensor([token]))[0]
            self._recent[token] = row
            if len(self._recent) > self.CACHED_ROWS:
                self._recent.popitem(last=False)
        else:
            self._recent.move_to_end(token)
        return row.clone()  # [dim]: the caller's to change


def int4_from_q4k(groups: Q4KGroups, dtype: torch.dtype) -> Int4Linear:
    """An int4 layer of the Q4_K values: scale = d * sc, zero = 8 * d * sc - dmin * m, so that the kernel's
    (q - 8) * scale + zero is Q4_K's (d * sc) * q - dmin * m."""
    scale = torch.from_numpy(groups.scale)  # [N, K/32] fp32
    zero = 8 * scale - torch.from_numpy(groups.offset)
    q = torch.from_numpy(groups.q).to(torch.int32)  # [N, K]
    return Int4Linear.from_groups(q, scale, zero, None, dtype)


def dense_linear(weight: Tensor) -> nn.Linear:
    """nn.Linear holding `weight` [N, K] as it is (no init pass)."""
    n, k = weight.shape
    layer = nn.Linear(k, n, bias=False, device="meta", dtype=weight.dtype)
    layer.weight = nn.Parameter(weight, requires_grad=False)
    return layer


def linear_from_gguf(
    tensors: GgufTensors,
    names: list[str],
    bias: Tensor | None,
    dtype: torch.dtype,
    quant: QuantMode = GGUF_INT4,
) -> nn.Module:
    """One layer for matrices `names` stacked along N: consecutive matrices of one form as one layer (for
    gguf-int4: Q4_K as int4, the rest dense; for gguf-a8: Q4_K or Q6_K on the engine's kernel, the rest
    dense); one module when all share a form, else a ConcatLinear."""
    parts: list[nn.Module] = []
    form_of = (
        tensors.kernel_form
        if quant == GGUF_A8
        else (lambda name: "Q4_K" if tensors.is_q4k(name) else "dense")
    )
    for form, run in itertools.groupby(names, key=form_of):
        run_names = list(run)
        if form == "dense":
            parts.append(dense_linear(torch.cat([tensors.dense(name, dtype) for name in run_names])))
        elif quant == GGUF_A8:
            parts.append(GgufKernelLinear(concat_packed([tensors.packed(name) for name in run_names])))
        else:
            parts.append(int4_from_q4k(concat_rows([tensors.q4k(name) for name in run_names]), dtype))
    if len(parts) > 1:
        return ConcatLinear(parts, bias)
    if bias is not None:
        parts[0].bias = nn.Parameter(bias, requires_grad=False)
    return parts[0]


def _check_shape(layer: nn.Module, expected: nn.Linear, name: str) -> nn.Module:
    parts = list(layer.parts) if isinstance(layer, ConcatLinear) else [layer]
    n = 0
    for part in parts:
        assert isinstance(part, Int4Linear | GgufKernelLinear | nn.Linear), type(part)
        n += part.out_features
    if n != expected.out_features:
        raise ValueError(f"{name}: the GGUF has {n} outputs, the model's config says {expected.out_features}")
    return layer


def _load_block(block: Block, tensors: GgufTensors, i: int, dtype: torch.dtype, quant: QuantMode) -> None:
    prefix = f"blk.{i}"
    block.attention_norm.weight = nn.Parameter(tensors.dense(f"{prefix}.attn_norm.weight", dtype))
    block.ffn_norm.weight = nn.Parameter(tensors.dense(f"{prefix}.ffn_norm.weight", dtype))
    attention, ffn = block.attention, block.feed_forward
    qkv = [f"{prefix}.attn_{p}" for p in "qkv"]
    bias = None
    if attention.wqkv.bias is not None:
        bias = torch.cat([tensors.dense(f"{name}.bias", dtype) for name in qkv])
    layers = {
        "wqkv": (attention, [f"{name}.weight" for name in qkv], bias),
        "wo": (attention, [f"{prefix}.attn_output.weight"], None),
        "w13": (ffn, [f"{prefix}.ffn_gate.weight", f"{prefix}.ffn_up.weight"], None),
        "w2": (ffn, [f"{prefix}.ffn_down.weight"], None),
    }
    for attr, (owner, names, layer_bias) in layers.items():
        layer = linear_from_gguf(tensors, names, layer_bias, dtype, quant)
        setattr(owner, attr, _check_shape(layer, getattr(owner, attr), f"{prefix} {attr}"))


def load_gguf_int4(
    path: Path,
    args: ModelArgs,
    *,
    max_seq_len: int,
    dtype: torch.dtype,
    device: str = "cpu",
    log: Log = log_to_stderr,
    quant: QuantMode = GGUF_INT4,
    draft_head_from: int | None = None,
) -> Transformer:
    """The engine's model with the GGUF file's Q4_K matrices as int4 and the rest dense (quant
    "gguf-int4"), or its Q4_K, Q6_K, Q4_0 and Q8_0 matrices as they are on the engine's own kernels
    (quant "gguf-a8"); CPU only. `draft_head_from` (gguf-a8, a draft only): the first special id, and the
    head scores the frequent ids and the specials only (`subset_draft_head`)."""
    check_device(quant, torch.device(device))
    tensors = GgufTensors(Path(path))
    if tensors.architecture not in GGUF_INT4_ARCHITECTURES:
        raise ValueError(
            f"quant {quant!r} reads {', '.join(GGUF_INT4_ARCHITECTURES)} GGUF files, not "
            f"{tensors.architecture!r} (its q/k rows are permuted): use quant 'int4' or the ggml backend"
        )
    if quant == GGUF_A8 and not tensors.pack_cache.directory.is_dir():
        log(
            f"{quant}: rearranging the file's blocks for the engine's kernel once (~20 s on 2 cores) into "
            f"{tensors.pack_cache.directory}"
        )
    with torch.device("meta"):
        model = Transformer(args, max_seq_len)
    model.tok_embeddings = GgufEmbedding(tensors.tensor("token_embd.weight"), dtype)
    model.norm.weight = nn.Parameter(tensors.dense("output_norm.weight", dtype))
    for i, block in enumerate(model.blocks):
        _load_block(block, tensors, i, dtype, quant)
    head = head_name(tensors)
    subset = None
    if quant == GGUF_A8 and draft_head_from is not None:
        subset = subset_draft_head(tensors, args.vocab_size, draft_head_from)
    model.output = subset if subset is not None else linear_from_gguf(tensors, [head], None, dtype, quant)
    cos, sin = rope_tables(args, max_seq_len)
    model.rope_cos, model.rope_sin = cos, sin
    model.quantization = quant
    if quant == GGUF_A8:
        for block in model.blocks:
            block.attention.row_by_row = True
            block.native = native_layer(block)
    meta = [name for name, t in itertools.chain(model.named_parameters(), model.named_buffers()) if t.is_meta]
    if meta:
        raise ValueError(f"the GGUF file {path} left {len(meta)} tensors unset, e.g. {meta[0]}")
    n_int4 = sum(isinstance(m, Int4Linear) for m in model.modules())
    n_kernel = sum(isinstance(m, GgufKernelLinear) for m in model.modules())
    n_dense = sum(isinstance(m, nn.Linear) for m in model.modules())
    if quant == GGUF_A8:
        log(
            f"{quant}: {n_kernel} layers hold the GGUF's blocks as they are on the engine's kernel "
            f"({gguf_mm().isa()}), {n_dense} stay dense ({dtype})"
        )
    else:
        log(f"{quant}: {n_int4} layers hold the GGUF's Q4_K weights as int4, {n_dense} stay dense ({dtype})")
    if subset is not None:
        log(f"{quant}: the draft's head scores {subset.ids.numel()} of {args.vocab_size} ids")
    return model.eval().requires_grad_(False)


def head_name(tensors: GgufTensors) -> str:
    """llama.cpp uses output.weight when the file has one (even if the config ties it), else the
    embeddings."""
    return "output.weight" if "output.weight" in tensors else "token_embd.weight"


def prepare_packed(name_or_path: str, log: Log = log_to_stderr, *, draft: bool = False) -> int:
    """Builds the engine's CPU kernels and rearranges a GGUF's Q4_K, Q6_K, Q4_0 and Q8_0 matrices for
    them into the pack cache, so that the first load of the native backend neither compiles nor packs
    (`make setup` runs it); idempotent. A draft's whole head is left out: it loads a subset head (packed,
    and rounded to 4 bits, on its first load: ~3 s). Returns how many matrices it packed now."""
    gguf_mm()
    tensors = GgufTensors(gguf_file_of(name_or_path, log))
    if tensors.architecture not in GGUF_INT4_ARCHITECTURES:
        return 0
    unused = {"token_embd.weight"} | ({head_name(tensors)} if draft else set())
    todo = [
        name
        for name in tensors.by_name
        if name not in unused and tensors.kernel_form(name) != "dense" and not tensors.pack_cache.has(name)
    ]
    if todo:
        log(f"{GGUF_A8}: rearranging {len(todo)} matrices of {name_or_path} for the engine's kernel (~20 s)")
    for name in todo:
        tensors.packed(name)
    return len(todo)


DRAFT_HEAD_IDS = 65536  # a draft's head keeps the first ids (BPE ranks: the frequent ones) and the specials


def draft_head_ids(vocab_size: int, n_regular: int, first_special: int) -> np.ndarray:
    """The ids a draft's subset head scores: 0 .. n_regular - 1 and the special ids from `first_special` up
    (end of turn among them), padded with the next regular ids to a multiple of 16 (the kernel's tile)."""
    ids = list(range(n_regular)) + list(range(first_special, vocab_size))
    pad = -len(ids) % 16
    ids = sorted(set(ids) | set(range(n_regular, n_regular + pad)))
    return np.asarray(ids, dtype=np.int64)


def subset_draft_head(tensors: GgufTensors, vocab_size: int, first_special: int) -> SubsetHead | None:
    """The draft's head over DRAFT_HEAD_IDS frequent ids and the specials, on the kernel; None where the
    file's head is not a type the kernel takes."""
    name = head_name(tensors)
    if tensors.kernel_form(name) == "dense":
        return None
    vocab, k = tensors.matrix_shape(name)
    ids = draft_head_ids(vocab, min(DRAFT_HEAD_IDS, first_special), first_special)
    raw = np.asarray(tensors.tensor(name).data)[ids]  # [S, bytes a row]
    kind = tensors.tensor(name).tensor_type
    if kind == GGMLQuantizationType.Q8_0:
        packed = tensors.pack_cache.get(f"{name}.subset-{len(ids)}-q4_0", lambda: _head_in_4_bits(raw, k))
    else:
        packed = tensors.pack_cache.get(f"{name}.subset-{len(ids)}", lambda: PACKERS[kind](raw, len(ids), k))
    return SubsetHead(GgufKernelLinear(packed), torch.from_numpy(ids), vocab_size)


def _head_in_4_bits(q8_0_rows: np.ndarray, k: int) -> PackedMatrix:
    """A draft's Q8_0 head rows rounded again to Q4_0 (~3 s once, then cached): its body is 4-bit already
    (engine/ggml_draft.py), and the head is 18% of what a draft step reads. Measured on the bundled pair
    (8 bench prompts, AMD EPYC Zen 5): draft step 5.44 -> 5.08 ms, the draft's top-1 agreement with the
    target's greedy tokens 0.795 -> 0.788. The target still decides every token."""
    values = np.asarray(dequantize(q8_0_rows, GGMLQuantizationType.Q8_0), dtype=np.float32)
    return pack_q4_0(quantize(values, GGMLQuantizationType.Q4_0), q8_0_rows.shape[0], k)


def load_native_draft(
    path: Path, args: ModelArgs, *, max_seq_len: int, first_special: int, log: Log = log_to_stderr
) -> Transformer:
    """A draft on the engine's kernels (quant gguf-a8, fp32 rows) with its head over the frequent ids
    (`subset_draft_head`): the output is still the target's, only the draft's cost falls."""
    return load_gguf_int4(
        path,
        args,
        max_seq_len=max_seq_len,
        dtype=torch.float32,
        log=log,
        quant=GGUF_A8,
        draft_head_from=first_special,
    )
