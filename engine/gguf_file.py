"""A GGUF file's tensors and architecture, read fast: the metadata values are skipped, not built.

`gguf.GGUFReader` builds every metadata value as numpy views of the memory map, and a Qwen file's
vocabulary is ~150,000 strings (plus merges): ~9.5 s a file on 2 cores, paid by every native load. Here the
values are stepped over with `struct` (the architecture string alone is kept), and the tensors come out as
gguf's `ReaderTensor`s (the same fields and data views), so the rest of the engine reads them the same way.
The format: ggml's docs/gguf.md (versions 2 and 3: 64-bit counts).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, ReaderTensor
from gguf.quants import quant_shape_to_byte_shape

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
STRING, ARRAY = 8, 9
SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # by value type
PLAIN_DTYPES = {
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


@dataclass(frozen=True)
class GgufFile:
    path: Path
    architecture: str
    tensors: list[ReaderTensor]


class _Cursor:
    def __init__(self, data: memoryview) -> None:
        self.data, self.at = data, 0

    def unpack(self, fmt: str) -> tuple[int, ...]:
        values = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return values

    def string(self) -> bytes:
        (length,) = self.unpack("<Q")
        self.at += length
        return bytes(self.data[self.at - length : self.at])

    def skip_value(self, kind: int) -> None:
        if kind == STRING:
            (length,) = self.unpack("<Q")
            self.at += length
        elif kind == ARRAY:
            item_kind, count = self.unpack("<IQ")
            if item_kind in SCALAR_SIZES:
                self.at += SCALAR_SIZES[item_kind] * count
            else:
                for _ in range(count):
                    self.skip_value(item_kind)
        elif kind in SCALAR_SIZES:
            self.at += SCALAR_SIZES[kind]
        else:
            raise ValueError(f"unknown GGUF value type {kind} at byte {self.at}")


def read_gguf(path: Path) -> GgufFile:
    """The file's architecture and tensors (data: views of one read-only memory map); read once per
    version of the file in a process."""
    stat = Path(path).stat()
    return _read(Path(path).resolve(), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=8)
def _read(path: Path, _size: int, _mtime_ns: int) -> GgufFile:
    mapped = np.memmap(path, mode="r")
    cursor = _Cursor(memoryview(mapped))  # type: ignore[arg-type]  # a memmap is a buffer
    magic = bytes(mapped[:4])
    if magic != MAGIC:
        raise ValueError(f"{path} is not a GGUF file (magic {magic!r})")
    cursor.at = 4
    version, n_tensors, n_kv = cursor.unpack("<IQQ")
    if version < 2:
        raise ValueError(f"{path}: GGUF version {version} is too old (32-bit counts); convert it again")
    architecture, alignment = "", DEFAULT_ALIGNMENT
    for _ in range(n_kv):
        key = cursor.string()
        (kind,) = cursor.unpack("<I")
        if key == b"general.architecture" and kind == STRING:
            architecture = cursor.string().decode()
        elif key == b"general.alignment" and kind == 4:
            (alignment,) = cursor.unpack("<I")
        else:
            cursor.skip_value(kind)
    infos = []
    for _ in range(n_tensors):
        name = cursor.string().decode()
        (n_dims,) = cursor.unpack("<I")
        dims = cursor.unpack(f"<{n_dims}Q")
        kind, offset = cursor.unpack("<IQ")
        infos.append((name, dims, GGMLQuantizationType(kind), offset))
    start = -(-cursor.at // alignment) * alignment
    return GgufFile(Path(path), architecture, [_tensor(mapped, start, *info) for info in infos])


def _tensor(
    mapped: np.memmap, start: int, name: str, dims: tuple[int, ...], kind: GGMLQuantizationType, offset: int
) -> ReaderTensor:
    n_elements = int(np.prod(dims))
    block_size, type_size = GGML_QUANT_SIZES[kind]
    n_bytes = n_elements * type_size // block_size
    shape = tuple(reversed(dims))  # numpy order: outermost first
    begin = start + offset
    if kind in PLAIN_DTYPES:
        data = mapped[begin : begin + n_bytes].view(PLAIN_DTYPES[kind]).reshape(shape)
    else:
        data = mapped[begin : begin + n_bytes].reshape(quant_shape_to_byte_shape(shape, kind))
    return ReaderTensor(
        name=name,
        tensor_type=kind,
        shape=np.asarray(dims, dtype=np.uint64),
        n_elements=n_elements,
        n_bytes=n_bytes,
        data_offset=begin,
        data=data,
        field=None,  # type: ignore[arg-type]
    )
