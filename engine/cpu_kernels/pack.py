"""A GGUF file's Q4_K, Q6_K, Q4_0 and Q8_0 matrices rearranged for engine/cpu_kernels (gguf_mm.cpp for
the K-quants, group32.cpp for the others), with no rounding.

Both the file and the kernels' layout hold the same values and the same scales; only the order changes:
tiles of 16 output channels, one block per (tile, super-block of 256 inputs; group of 32 for Q4_0 / Q8_0),
and in a block the quants of 16 channels x 4 consecutive inputs side by side (64 bytes: what one VNNI dot
product takes). The C++ files' headers give every byte's place.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.q4k import Q4K_BLOCK_BYTES, SUPER_BLOCK, unpack_scales_mins

TILE = 16  # output channels per tile
GROUP = 32  # inputs per block of Q4_0 / Q8_0
Q6K_BLOCK_BYTES = 210  # ggml's Q6_K: ql[128], qh[64], scales[16] int8, d fp16
Q4_0_BLOCK_BYTES = 18  # ggml's Q4_0: d fp16, 16 bytes of nibbles (input j low, j + 16 high)
Q8_0_BLOCK_BYTES = 34  # ggml's Q8_0: d fp16, 32 int8
Q4K_PACKED_BYTES = 2368  # per (tile, super-block): quants 2048, sc 128, m 128, d 32, dmin 32
Q6K_PACKED_BYTES = 3360  # quants 2048, high bits 1024, sc 256, d 32
Q4_0_PACKED_BYTES = 288  # per (tile, group of 32): quants 256, d 32
Q8_0_PACKED_BYTES = 544  # quants 512 (q + 128), d 32
KINDS = ("Q4_K", "Q6_K", "Q4_0", "Q8_0")


@dataclass(frozen=True)
class PackedMatrix:
    """One matrix [N, K] in the kernels' layout: blocks [N / 16, K / 256 (K / 32), block bytes] uint8."""

    blocks: np.ndarray
    n: int
    k: int
    kind: str  # one of KINDS: the file's block type

    @property
    def q6(self) -> bool:
        return self.kind == "Q6_K"


def _check_shape(n: int, k: int, kind: str) -> None:
    if k % SUPER_BLOCK or n % TILE:
        raise ValueError(f"{kind} packing needs K in 256s and N in 16s, got N = {n}, K = {k}")


def _pack_low_nibbles(q: np.ndarray, n: int, k: int) -> np.ndarray:
    """q [N, K] (values 0..15 in the low 4 bits) -> [T, B, 8 groups, 4 pairs, 64] uint8: pair p of a group
    of 32 holds k4 vector 2p in its low nibbles and 2p + 1 in its high ones; byte 4c + i is channel c,
    input 4j + i of the group."""
    t, b = n // TILE, k // SUPER_BLOCK
    grid = (q & 0x0F).reshape(t, TILE, b, 8, 4, 2, 4)  # [T, c, B, g, p, nibble, i]
    grid = grid.transpose(0, 2, 3, 4, 5, 1, 6)  # [T, B, g, p, nibble, c, i]
    packed = grid[:, :, :, :, 0] | (grid[:, :, :, :, 1] << 4)  # [T, B, g, p, c, i]
    return packed.reshape(t, b, 8, 4, 64).astype(np.uint8)


def _per_tile(values: np.ndarray, n: int, k: int) -> np.ndarray:
    """[N, B * G] per-channel values -> [T, B, G * 16] (channels innermost), same dtype."""
    t, b = n // TILE, k // SUPER_BLOCK
    groups = values.shape[1] // b
    return values.reshape(t, TILE, b, groups).transpose(0, 2, 3, 1).reshape(t, b, groups * TILE)


def _as_bytes(values: np.ndarray) -> np.ndarray:
    """[T, B, X] of any dtype -> [T, B, X * itemsize] uint8 (little-endian, as the kernel reads them)."""
    t, b = values.shape[:2]
    return np.ascontiguousarray(values).view(np.uint8).reshape(t, b, -1)


def pack_q4k(raw: np.ndarray, n: int, k: int) -> PackedMatrix:
    """The bytes of a Q4_K matrix ([N, K / 256 * 144] uint8, as gguf's reader gives them) -> packed."""
    _check_shape(n, k, "Q4_K")
    blocks = np.ascontiguousarray(raw).reshape(n * k // SUPER_BLOCK, Q4K_BLOCK_BYTES)
    d = blocks[:, 0:2].copy().view(np.float16).reshape(n, k // SUPER_BLOCK)
    dmin = blocks[:, 2:4].copy().view(np.float16).reshape(n, k // SUPER_BLOCK)
    sc, m = unpack_scales_mins(blocks[:, 4:16])  # [N * B, 8] each
    chunks = blocks[:, 16:].reshape(-1, 4, 32)  # chunk j: sub-block 2j low nibbles, 2j + 1 high
    q = np.stack([chunks & 0x0F, chunks >> 4], axis=2).reshape(n, k)
    packed = np.concatenate(
        [
            _pack_low_nibbles(q, n, k).reshape(n // TILE, k // SUPER_BLOCK, 2048),
            _per_tile(sc.reshape(n, -1), n, k),
            _per_tile(m.reshape(n, -1), n, k),
            _as_bytes(_per_tile(d, n, k)),
            _as_bytes(_per_tile(dmin, n, k)),
        ],
        axis=2,
    )
    assert packed.shape[2] == Q4K_PACKED_BYTES, packed.shape
    return PackedMatrix(np.ascontiguousarray(packed), n, k, "Q4_K")


def unpack_q6k(raw: np.ndarray, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The bytes of a Q6_K matrix -> (q [N, K] uint8 in 0..63, sc [N, K / 16] int8, d [N, K / 256] fp16),
    with w = d * sc * (q - 32)."""
    _check_shape(n, k, "Q6_K")
    blocks = np.ascontiguousarray(raw).reshape(n * k // SUPER_BLOCK, Q6K_BLOCK_BYTES)
    ql = blocks[:, :128].reshape(-1, 2, 64)  # per half of 128 inputs
    qh = blocks[:, 128:192].reshape(-1, 2, 32)
    sc = blocks[:, 192:208].copy().view(np.int8).reshape(n, k // 16)
    d = blocks[:, 208:210].copy().view(np.float16).reshape(n, k // SUPER_BLOCK)
    # Within a half: inputs 0-31 low nibbles of ql[0:32] and qh bits 0-1; 32-63 ql[32:64], bits 2-3;
    # 64-95 ql[0:32] high nibbles, bits 4-5; 96-127 ql[32:64] high nibbles, bits 6-7.
    quarters = [
        (ql[:, :, :32] & 0x0F) | (((qh >> 0) & 3) << 4),
        (ql[:, :, 32:] & 0x0F) | (((qh >> 2) & 3) << 4),
        (ql[:, :, :32] >> 4) | (((qh >> 4) & 3) << 4),
        (ql[:, :, 32:] >> 4) | (((qh >> 6) & 3) << 4),
    ]
    q = np.stack(quarters, axis=2).reshape(n, k)  # [blocks, half, quarter, 32]
    return q.astype(np.uint8), sc, d


def pack_q6k(raw: np.ndarray, n: int, k: int) -> PackedMatrix:
    """The bytes of a Q6_K matrix -> packed."""
    q, sc, d = unpack_q6k(raw, n, k)
    t, b = n // TILE, k // SUPER_BLOCK
    high = (q >> 4).reshape(t, TILE, b, 16, 4, 4).transpose(0, 2, 3, 1, 5, 4)  # [T, B, h, c, i, jj]
    high_bits = high[..., 0] | (high[..., 1] << 2) | (high[..., 2] << 4) | (high[..., 3] << 6)
    packed = np.concatenate(
        [
            _pack_low_nibbles(q, n, k).reshape(t, b, 2048),
            high_bits.reshape(t, b, 1024).astype(np.uint8),
            _as_bytes(_per_tile(sc, n, k)),
            _as_bytes(_per_tile(d, n, k)),
        ],
        axis=2,
    )
    assert packed.shape[2] == Q6K_PACKED_BYTES, packed.shape
    return PackedMatrix(np.ascontiguousarray(packed), n, k, "Q6_K")


def concat_packed(parts: list[PackedMatrix]) -> PackedMatrix:
    """Matrices of one kind and the same K stacked along N (tiles are whole channels, so they stack)."""
    assert len({(p.k, p.kind) for p in parts}) == 1, [(p.k, p.kind) for p in parts]
    return PackedMatrix(
        np.concatenate([p.blocks for p in parts]), sum(p.n for p in parts), parts[0].k, parts[0].kind
    )


def _group_check(n: int, k: int, kind: str) -> None:
    if k % GROUP or n % TILE:
        raise ValueError(f"{kind} packing needs K in 32s and N in 16s, got N = {n}, K = {k}")


def _pack_group_quants(q: np.ndarray, n: int, k: int, nibbles: bool) -> np.ndarray:
    """q [N, K] (0..15, or 0..255) -> [T, G, quant bytes]: per group of 32 its k4 vectors, paired into
    nibbles (k4 vector 2p low, 2p + 1 high) or one byte each."""
    t, g = n // TILE, k // GROUP
    if nibbles:
        grid = q.reshape(t, TILE, g, 4, 2, 4).transpose(0, 2, 3, 4, 1, 5)  # [T, G, p, nibble, c, i]
        return (grid[:, :, :, 0] | (grid[:, :, :, 1] << 4)).reshape(t, g, 256).astype(np.uint8)
    grid = q.reshape(t, TILE, g, 8, 4).transpose(0, 2, 3, 1, 4)  # [T, G, j, c, i]
    return grid.reshape(t, g, 512).astype(np.uint8)


def pack_q4_0(raw: np.ndarray, n: int, k: int) -> PackedMatrix:
    """The bytes of a Q4_0 matrix ([N, K / 32 * 18] uint8) -> packed; w = d * (q - 8)."""
    _group_check(n, k, "Q4_0")
    blocks = np.ascontiguousarray(raw).reshape(n * k // GROUP, Q4_0_BLOCK_BYTES)
    d = blocks[:, 0:2].copy().view(np.float16).reshape(n, k // GROUP)
    nibbles = blocks[:, 2:]
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=1).reshape(n, k)  # inputs 0-15, then 16-31
    t, g = n // TILE, k // GROUP
    d_tiles = d.reshape(t, TILE, g).transpose(0, 2, 1)  # [T, G, 16]
    packed = np.concatenate([_pack_group_quants(q, n, k, True), _as_bytes(d_tiles)], axis=2)
    assert packed.shape[2] == Q4_0_PACKED_BYTES, packed.shape
    return PackedMatrix(np.ascontiguousarray(packed), n, k, "Q4_0")


def pack_q8_0(raw: np.ndarray, n: int, k: int) -> PackedMatrix:
    """The bytes of a Q8_0 matrix ([N, K / 32 * 34] uint8) -> packed, the int8 values stored as q + 128."""
    _group_check(n, k, "Q8_0")
    blocks = np.ascontiguousarray(raw).reshape(n * k // GROUP, Q8_0_BLOCK_BYTES)
    d = blocks[:, 0:2].copy().view(np.float16).reshape(n, k // GROUP)
    unsigned = (blocks[:, 2:] ^ 0x80).reshape(n, k)  # int8 q as the byte q + 128
    t, g = n // TILE, k // GROUP
    d_tiles = d.reshape(t, TILE, g).transpose(0, 2, 1)
    packed = np.concatenate([_pack_group_quants(unsigned, n, k, False), _as_bytes(d_tiles)], axis=2)
    assert packed.shape[2] == Q8_0_PACKED_BYTES, packed.shape
    return PackedMatrix(np.ascontiguousarray(packed), n, k, "Q8_0")


class PackCache:
    """Packed matrices of one GGUF file kept under `directory` (one .npy each), so that a model packs once:
    a later load reads ~1 GB of blocks instead of rearranging them again (~20 s on 2 cores), and never
    holds the file's pages and the packed copies at once (the peak memory of a first load)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @classmethod
    def for_file(cls, gguf: Path, root: Path) -> PackCache:
        """The cache of `gguf` under `root`: keyed by the file's name, size and mtime and this module's
        source (a changed layout never reads old blocks)."""
        stat = gguf.stat()
        key = f"{gguf.resolve()} {stat.st_size} {stat.st_mtime_ns} {Path(__file__).read_bytes().hex()}"
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        return cls(root / f"{gguf.stem}-{digest}")

    def has(self, name: str) -> bool:
        return (self.directory / f"{name}.shape").is_file()

    def get(self, name: str, make: Callable[[], PackedMatrix]) -> PackedMatrix:
        blocks_file = self.directory / f"{name}.npy"
        meta_file = self.directory / f"{name}.shape"
        if blocks_file.is_file() and meta_file.is_file():
            n, k, kind = meta_file.read_text().split()
            if kind in KINDS:  # else an entry of another layout: packed again
                return PackedMatrix(np.load(blocks_file), int(n), int(k), kind)
        packed = make()
        self.directory.mkdir(parents=True, exist_ok=True)
        partial = blocks_file.with_name(f"{name}.{os.getpid()}.partial.npy")
        np.save(partial, packed.blocks)
        os.replace(partial, blocks_file)
        meta_file.write_text(f"{packed.n} {packed.k} {packed.kind}\n")  # last: it marks the entry whole
        return packed
