"""Moonshine's `.ort` graphs rebuilt once as float ONNX graphs: what made each decoder step cost 60+ ms.

The moonshine-cpp `.ort` files keep every weight as int8 with one scale and one offset per tensor, and
dequantise it inside the graph: `Cast(int8) -> Mul(scale) -> Add(offset)`, 81 weights in the merged
decoder's main graph (51 in the encoder). onnxruntime does not constant-fold an `.ort` model, so every
decoder step re-dequantised all 41M decoder weights (~40 MB of int8 into ~165 MB of float) and transposed
the 32768x416 embedding for the logits: 55 of the 65-95 ms a step took on a 2-core AVX2 EPYC
(bench/results/2026-12-01-cpu-moonshine-speed.md).

`float_graphs(directory)` builds, once per cache, `encoder_model.onnx` and `decoder_model_merged.onnx` beside
a manifest of their sha256: onnxruntime itself writes each `.ort` graph out as ONNX (no graph optimisation:
the graph as shipped), every dequantisation chain is replaced by its float result (computed with the same
float32 operations, so the same weights), and the two branches of the decoder's `If` get the names ONNX
requires. Nothing is tuned for the CPU it is built on: onnxruntime optimises the graph when it loads it.

Beside the float decoder, `decoder_model_merged.int8.onnx`: the same graph with every weight MatMul over the
decoder's own tokens as onnxruntime's `MatMulNBits` (8 bits, blocks of 32 along K, accuracy level 4). Each
weight was shipped on a per-tensor int8 grid (`w = q * scale + offset`, with `offset` a whole number of
`scale`s), so `(u - zero_point) * scale` with `u = q + 128` holds the very same weights, a quarter of the
float bytes; level 4 quantises the activations too, each row in blocks of 32 (as llama.cpp's Q8 activations),
and multiplies in int8 (VNNI where the CPU has it). A decoder step reads ~41 MB of weights instead of ~165:
on the 2-core AVX-512 Xeon a step fell from 12-17 ms to 6-8, a drafted pass over a question by 5-20 ms,
with the same transcripts (bench/results/2026-12-07-cpu-xeon-amx-167-moonshine-int8.md). The
cross-attention's keys and values, computed once per pass over every encoder frame (100+ rows), stay float:
there the float kernels are faster.

ONNX's protobuf schema is not a dependency here: the few fields touched are declared below (field numbers
from onnx.proto, fixed by the format); every other field passes through untouched as an unknown field.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = ["MoonshineGraphs", "MoonshineGraphError", "float_graphs", "ort_graphs", "rebuild_float_graph"]

FORMAT_VERSION = 2  # 2: the int8 decoder beside the float graphs
MANIFEST = "float-graphs.json"
GRAPH_FILES = ("encoder_model", "decoder_model_merged")  # <name>.ort -> <name>.onnx
INT8_GRAPH_FILES = ("decoder_model_merged",)  # <name>.ort -> <name>.int8.onnx as well
BUILT_FILES = (*GRAPH_FILES, *(f"{name}.int8" for name in INT8_GRAPH_FILES))  # <built>.onnx
FLOAT, UINT8, INT8 = 1, 2, 3  # TensorProto.DataType
ELEMENT_TYPES = {FLOAT: np.float32, UINT8: np.uint8, INT8: np.int8}
ATTRIBUTE_INT = 2  # AttributeProto.AttributeType.INT
INT8_BLOCK = 32  # MatMulNBits' block along K (every block's scale is the tensor's one scale)
INT8_ACCURACY_LEVEL = 4  # int8 activations and products (levels 0-2 dequantise per call: 6-30x float's time)
FLOAT_MATMUL_INPUTS = frozenset({"encoder_hidden_states"})  # 100+ rows: the float kernels are faster there

Proto = Any  # a message of the dynamic ONNX subset below (mypy cannot see dynamic protobuf classes)


class MoonshineGraphError(RuntimeError):
    """A rebuilt graph is missing, damaged or not what the source graph should give."""


@dataclass(frozen=True)
class MoonshineGraphs:
    """The encoder and merged-decoder files one `MoonshineModel` runs."""

    encoder: Path
    decoder: Path
    int8_decoder: Path | None = None  # the decoder with int8 MatMuls (None: there is none)


def ort_graphs(directory: Path) -> MoonshineGraphs:
    """The shipped `.ort` graphs (the reference: slow, dequantising on every run)."""
    return MoonshineGraphs(directory / "encoder_model.ort", directory / "decoder_model_merged.ort")


# ----- the ONNX subset: (name, field number, type, repeated) per message ---------------------------------
_F = descriptor_pb2.FieldDescriptorProto
ONNX_SUBSET: dict[str, list[tuple[str, int, int | str, bool]]] = {
    "TensorProto": [("dims", 1, _F.TYPE_INT64, True), ("data_type", 2, _F.TYPE_INT32, False),
                    ("name", 8, _F.TYPE_STRING, False), ("raw_data", 9, _F.TYPE_BYTES, False)],
    "AttributeProto": [("name", 1, _F.TYPE_STRING, False), ("i", 3, _F.TYPE_INT64, False),
                       ("g", 6, "GraphProto", False), ("ints", 8, _F.TYPE_INT64, True),
                       ("graphs", 11, "GraphProto", True), ("type", 20, _F.TYPE_INT32, False)],
    "NodeProto": [("input", 1, _F.TYPE_STRING, True), ("output", 2, _F.TYPE_STRING, True),
                  ("name", 3, _F.TYPE_STRING, False), ("op_type", 4, _F.TYPE_STRING, False),
                  ("attribute", 5, "AttributeProto", True), ("domain", 7, _F.TYPE_STRING, False)],
    "GraphProto": [("node", 1, "NodeProto", True), ("name", 2, _F.TYPE_STRING, False),
                   ("initializer", 5, "TensorProto", True), ("output", 12, "ValueInfoProto", True)],
    "ValueInfoProto": [("name", 1, _F.TYPE_STRING, False)],
    "ModelProto": [("graph", 7, "GraphProto", False)],
}  # fmt: skip
PACKAGE = "voiceagent_onnx_subset"


def onnx_message(name: str) -> Any:
    """The message class of ONNX's `name` (e.g. "ModelProto"), holding only the fields of ONNX_SUBSET."""
    return message_factory.GetMessageClass(onnx_subset_pool().FindMessageTypeByName(f"{PACKAGE}.{name}"))


@functools.cache
def onnx_subset_pool() -> descriptor_pool.DescriptorPool:
    file = descriptor_pb2.FileDescriptorProto(name=f"{PACKAGE}.proto", package=PACKAGE, syntax="proto2")
    for message_name, fields in ONNX_SUBSET.items():
        message = file.message_type.add(name=message_name)
        for field_name, number, kind, repeated in fields:
            field = message.field.add(name=field_name, number=number)
            field.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
            if isinstance(kind, str):
                field.type, field.type_name = _F.TYPE_MESSAGE, f".{PACKAGE}.{kind}"
            else:
                field.type = kind
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return pool


# ----- folding the dequantisation chains ---------------------------------------------------------------
def tensor_array(tensor: Proto) -> np.ndarray:
    """A raw-data initializer of a known element type -> its array."""
    if tensor.data_type not in ELEMENT_TYPES or not tensor.HasField("raw_data"):
        raise MoonshineGraphError(f"initializer {tensor.name!r}: expected raw int8, uint8 or float32 data")
    array = np.frombuffer(tensor.raw_data, dtype=ELEMENT_TYPES[tensor.data_type])
    return array.reshape(tuple(tensor.dims))


def float_tensor(name: str, array: np.ndarray) -> Proto:
    return raw_tensor(name, np.asarray(array, dtype="<f4"), FLOAT)


def raw_tensor(name: str, array: np.ndarray, data_type: int) -> Proto:
    """An initializer holding `array` as raw little-endian data of ONNX type `data_type`."""
    assert np.dtype(ELEMENT_TYPES[data_type]).itemsize == array.dtype.itemsize, (data_type, array.dtype)
    tensor = onnx_message("TensorProto")(name=name, data_type=data_type)
    tensor.dims.extend(array.shape)
    tensor.raw_data = np.ascontiguousarray(array).tobytes()
    return tensor


def subgraphs(graph: Proto) -> list[Proto]:
    """The graphs held by `graph`'s nodes' attributes (an If's two branches), not recursively."""
    found = []
    for node in graph.node:
        for attribute in node.attribute:
            found.extend([attribute.g] if attribute.HasField("g") else [])
            found.extend(attribute.graphs)
    return found


def names_read(graph: Proto) -> set[str]:
    """Every value name read by a node of `graph` or of a graph inside it (outer-scope reads count), or
    given out as one of their outputs."""
    read = {name for node in graph.node for name in node.input} | {value.name for value in graph.output}
    for inner in subgraphs(graph):
        read |= names_read(inner)
    return read


@dataclass(frozen=True)
class DequantizeChain:
    """`output = float(quantized) * scale + offset`, three nodes reading three initializers."""

    cast: Proto
    mul: Proto
    add: Proto

    @property
    def initializer_names(self) -> tuple[str, str, str]:
        return self.cast.input[0], self.mul.input[1], self.add.input[1]


def dequantize_chains(graph: Proto) -> list[DequantizeChain]:
    """The graph's Cast(int8 initializer) -> Mul(initializer) -> Add(initializer) chains."""
    initializers = {t.name: t for t in graph.initializer}
    producer = {output: node for node in graph.node for output in node.output}
    chains = []
    for add in graph.node:
        mul = producer.get(add.input[0]) if add.op_type == "Add" and len(add.input) == 2 else None
        if mul is None or mul.op_type != "Mul" or mul.input[1] not in initializers:
            continue
        cast = producer.get(mul.input[0])
        if cast is None or cast.op_type != "Cast" or add.input[1] not in initializers:
            continue
        if cast.input[0] in initializers and initializers[cast.input[0]].data_type == INT8:
            chains.append(DequantizeChain(cast, mul, add))
    return chains


def dequantized(chain: DequantizeChain, initializers: dict[str, Proto]) -> np.ndarray:
    """The chain's float weight, with the graph's own float32 operations (one rounding per Mul and Add)."""
    quantized, scale, offset = (tensor_array(initializers[n]) for n in chain.initializer_names)
    if scale.dtype != np.float32 or offset.dtype != np.float32:
        raise MoonshineGraphError(f"{chain.add.output[0]}: expected a float32 scale and offset")
    weight = quantized.astype(np.float32) * scale + offset
    if weight.shape != quantized.shape or weight.dtype != np.float32:
        raise MoonshineGraphError(f"{chain.add.output[0]}: scale/offset change the weight's shape")
    return weight


def fold_dequantize_chains(graph: Proto) -> int:
    """Replaces each chain by a float initializer of its output's name; drops the chain's nodes, and its
    initializers where nothing else reads them. Returns the number of chains folded."""
    chains = dequantize_chains(graph)
    initializers = {t.name: t for t in graph.initializer}
    folded = [float_tensor(c.add.output[0], dequantized(c, initializers)) for c in chains]
    chain_nodes = {id(node) for c in chains for node in (c.cast, c.mul, c.add)}
    kept_nodes = [node for node in graph.node if id(node) not in chain_nodes]
    del graph.node[:]
    graph.node.extend(kept_nodes)
    unread = {name for c in chains for name in c.initializer_names} - names_read(graph)
    kept = [t for t in graph.initializer if t.name not in unread]
    del graph.initializer[:]
    graph.initializer.extend([*kept, *folded])
    return len(chains)


def name_subgraphs(graph: Proto, prefix: str) -> None:
    """ONNX requires every graph to have a name; onnxruntime's ORT-format export leaves branches blank."""
    for node in graph.node:
        for attribute in node.attribute:
            inner = ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs)
            for i, branch in enumerate(inner):
                branch_name = f"{prefix}/{node.name or node.op_type}/{attribute.name}{i or ''}"
                if not branch.name:
                    branch.name = branch_name
                name_subgraphs(branch, branch_name)


# ----- int8 MatMuls for the decoder's own tokens ---------------------------------------------------------
@dataclass(frozen=True)
class Int8Grid:
    """A chain's weight as unsigned 8-bit values on its grid: `weight = (values - zero_point) * scale`."""

    values: np.ndarray  # uint8, the weight's shape
    scale: float
    zero_point: int


def int8_grid(chain: DequantizeChain, initializers: dict[str, Proto]) -> Int8Grid | None:
    """`q * scale + offset` as `(q + 128 - zero_point) * scale`, the same weights with the same grid; None
    where the offset is not a whole number of steps (or the scale and offset are not one value each)."""
    quantized, scale, offset = (tensor_array(initializers[n]) for n in chain.initializer_names)
    if scale.size != 1 or offset.size != 1 or float(scale.flat[0]) <= 0:
        return None
    steps = float(offset.flat[0]) / float(scale.flat[0])
    zero_point = 128 - round(steps)
    if abs(steps - round(steps)) > 1e-3 or not 0 <= zero_point <= 255:
        return None
    values = (quantized.astype(np.int16) + 128).astype(np.uint8)
    return Int8Grid(values, float(scale.flat[0]), zero_point)


def swaps_two_axes(node: Proto) -> bool:
    """A Transpose that swaps the two axes of a matrix (no perm given, or perm [1, 0])."""
    perms = [list(a.ints) for a in node.attribute if a.name == "perm"]
    return node.op_type == "Transpose" and (not perms or perms[0] == [1, 0])


def nbits_initializers(prefix: str, weight: Int8Grid, transposed: bool) -> tuple[list[Proto], int, int]:
    """MatMulNBits' B [N, K / block, block] uint8, scales [N * K / block] and zero points (one per block)
    for `x @ W`, W [K, N] the grid's values (or their transpose); returns them with K and N."""
    matrix = weight.values.T if transposed else weight.values  # [K, N]
    k, n = matrix.shape
    blocks = k // INT8_BLOCK
    b = np.ascontiguousarray(matrix.T).reshape(n, blocks, INT8_BLOCK)
    scales = np.full(n * blocks, weight.scale, dtype=np.float32)
    zero_points = np.full(n * blocks, weight.zero_point, dtype=np.uint8)
    tensors = [raw_tensor(f"{prefix}_q", b, UINT8), float_tensor(f"{prefix}_scales", scales),
               raw_tensor(f"{prefix}_zero_points", zero_points, UINT8)]  # fmt: skip
    return tensors, k, n


def int_attribute(name: str, value: int) -> Proto:
    return onnx_message("AttributeProto")(name=name, i=value, type=ATTRIBUTE_INT)


def make_nbits(node: Proto, weight: str, k: int, n: int) -> None:
    """Turns `MatMul(x, W)` into `MatMulNBits(x, <weight>_q, <weight>_scales, <weight>_zero_points)`."""
    x = node.input[0]
    del node.input[:]
    node.input.extend([x, f"{weight}_q", f"{weight}_scales", f"{weight}_zero_points"])
    node.op_type, node.domain = "MatMulNBits", "com.microsoft"
    node.name = f"{node.name}_int8"
    node.attribute.extend([int_attribute("K", k), int_attribute("N", n), int_attribute("bits", 8),
                           int_attribute("block_size", INT8_BLOCK),
                           int_attribute("accuracy_level", INT8_ACCURACY_LEVEL)])  # fmt: skip


def int8_matmuls(graph: Proto, grids: dict[str, Int8Grid]) -> int:
    """Every MatMul, in `graph` or a graph inside it, of an activation by a weight of `grids` (by its folded
    name, or through a Transpose of it) becomes a MatMulNBits on the weight's own grid, unless its activation
    is one of FLOAT_MATMUL_INPUTS or K is not a multiple of INT8_BLOCK. The new initializers go into `graph`
    (the branches read it); the Transposes and float weights nothing reads any more are dropped. Returns
    the MatMuls rewritten."""
    made: dict[tuple[str, bool], tuple[str, int, int]] = {}
    new_initializers: list[Proto] = []

    def rewrite(current: Proto) -> int:
        transposes = {
            n.output[0]: n.input[0] for n in current.node if swaps_two_axes(n) and n.input[0] in grids
        }
        count = sum(rewrite(inner) for inner in subgraphs(current))
        for node in current.node:
            if node.op_type != "MatMul" or node.domain or node.input[0] in FLOAT_MATMUL_INPUTS:
                continue
            weight, transposed = node.input[1], False
            if weight not in grids:
                weight, transposed = transposes.get(node.input[1], ""), True
            if weight not in grids or grids[weight].values.ndim != 2:
                continue
            if grids[weight].values.shape[1 if transposed else 0] % INT8_BLOCK:
                continue  # K
            if (weight, transposed) not in made:
                prefix = f"{weight}_int8{'_transposed' if transposed else ''}"
                tensors, k, n = nbits_initializers(prefix, grids[weight], transposed)
                new_initializers.extend(tensors)
                made[(weight, transposed)] = (prefix, k, n)
            make_nbits(node, *made[(weight, transposed)])
            count += 1
        return count

    rewritten = rewrite(graph)
    graph.initializer.extend(new_initializers)
    drop_unread_transposes(graph, set(grids))
    read = names_read(graph)
    kept = [t for t in graph.initializer if t.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return rewritten


def drop_unread_transposes(graph: Proto, weights: set[str]) -> None:
    """Removes, in `graph` and the graphs inside it, each Transpose of one of `weights` whose output nothing
    reads any more."""
    read = names_read(graph)

    def drop(current: Proto) -> None:
        kept = [
            n
            for n in current.node
            if not (swaps_two_axes(n) and n.input[0] in weights and n.output[0] not in read)
        ]
        del current.node[:]
        current.node.extend(kept)
        for inner in subgraphs(current):
            drop(inner)

    drop(graph)


# ----- building and checking the files -----------------------------------------------------------------
def exported_onnx(ort_path: Path, scratch: Path) -> bytes:
    """The `.ort` model as onnxruntime writes it in ONNX, with no graph optimisation applied."""
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.optimized_model_filepath = str(scratch / f"{ort_path.stem}.exported.onnx")
    onnxruntime.InferenceSession(str(ort_path), options, providers=["CPUExecutionProvider"])
    return Path(options.optimized_model_filepath).read_bytes()


def rebuild_float_graph(ort_path: Path, dest: Path, int8_dest: Path | None = None) -> int:
    """Writes `ort_path`'s graph with float weights to `dest` (ONNX), and with `int8_matmuls` on top of
    that to `int8_dest` if given; returns the chains folded."""
    with tempfile.TemporaryDirectory(dir=dest.parent) as scratch:
        model = onnx_message("ModelProto").FromString(exported_onnx(ort_path, Path(scratch)))
    grids = int8_grids(model.graph) if int8_dest is not None else {}
    folded = fold_dequantize_chains(model.graph)
    if folded == 0:
        raise MoonshineGraphError(f"{ort_path.name}: no int8 weights found to fold (a different model?)")
    name_subgraphs(model.graph, ort_path.stem)
    dest.write_bytes(model.SerializeToString(deterministic=True))
    if int8_dest is not None:
        if int8_matmuls(model.graph, grids) == 0:
            raise MoonshineGraphError(
                f"{ort_path.name}: no MatMul of a weight on an int8 grid (a different model?)"
            )
        int8_dest.write_bytes(model.SerializeToString(deterministic=True))
    return folded


def int8_grids(graph: Proto) -> dict[str, Int8Grid]:
    """The graph's dequantisation chains that are on a whole-step grid, by their output's name."""
    initializers = {t.name: t for t in graph.initializer}
    grids = {chain.add.output[0]: int8_grid(chain, initializers) for chain in dequantize_chains(graph)}
    return {name: grid for name, grid in grids.items() if grid is not None}


def file_sha256(path: Path) -> str:
    with open(path, "rb") as source:
        return hashlib.file_digest(source, "sha256").hexdigest()


def float_dir(directory: Path) -> Path:
    """Where the float graphs of the prepared model in `directory` live: a sibling `<name>-float`."""
    return directory.with_name(f"{directory.name}-float")


def manifest_of(directory: Path) -> dict[str, Any] | None:
    try:
        manifest = json.loads((float_dir(directory) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    sources = {name: file_sha256(directory / f"{name}.ort") for name in GRAPH_FILES}
    if manifest.get("format_version") != FORMAT_VERSION or manifest.get("sources") != sources:
        return None  # an older build, or one from other source files
    return dict(manifest)


def build_float_graphs(directory: Path) -> None:
    """Rebuilds the graphs into a fresh folder and moves it into place (manifest written last)."""
    out = float_dir(directory)
    partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        files, sources, folded = {}, {}, {}
        for name in GRAPH_FILES:
            source, dest = directory / f"{name}.ort", partial / f"{name}.onnx"
            int8_dest = partial / f"{name}.int8.onnx" if name in INT8_GRAPH_FILES else None
            folded[name] = rebuild_float_graph(source, dest, int8_dest)
            sources[name] = file_sha256(source)
        for built in BUILT_FILES:
            dest = partial / f"{built}.onnx"
            files[built] = {"size": dest.stat().st_size, "sha256": file_sha256(dest)}
        manifest = {"format_version": FORMAT_VERSION, "onnxruntime": onnxruntime.__version__,
                    "sources": sources, "folded_weights": folded, "files": files}  # fmt: skip
        (partial / MANIFEST).write_text(json.dumps(manifest, indent=2))
        if manifest_of(directory) is None:  # else another process finished first: keep its files
            shutil.rmtree(out, ignore_errors=True)
            os.replace(partial, out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def check_float_graphs(directory: Path, manifest: dict[str, Any]) -> MoonshineGraphs:
    """The rebuilt files, each checked against the sha256 its manifest recorded when it was built."""
    out = float_dir(directory)
    for name in BUILT_FILES:
        expected = manifest["files"][name]["sha256"]
        actual = file_sha256(out / f"{name}.onnx")
        if actual != expected:
            damaged = f"{out / name}.onnx is damaged (sha256 {actual}, built as {expected})"
            raise MoonshineGraphError(f"{damaged}; delete {out} to rebuild it")
    decoder = out / "decoder_model_merged.onnx"
    return MoonshineGraphs(out / "encoder_model.onnx", decoder, decoder.with_suffix(".int8.onnx"))


def float_graphs(directory: Path) -> MoonshineGraphs:
    """The float graphs (and the int8 decoder) of the prepared Moonshine model in `directory`: built on the
    first call for these source files (~10 s, ~350 MB), checked by sha256 on every call (~0.5 s)."""
    manifest = manifest_of(directory)
    if manifest is None:
        build_float_graphs(directory)
        manifest = manifest_of(directory)
    if manifest is None:
        raise MoonshineGraphError(f"the float graphs in {float_dir(directory)} did not build")
    return check_float_graphs(directory, manifest)
