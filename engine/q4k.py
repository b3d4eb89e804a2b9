"""ggml's Q4_K blocks, unpacked into asymmetric 4-bit groups of 32 (no rounding: every value is the file's).

A Q4_K matrix [N, K] is stored row by row in super-blocks of 256 weights (144 bytes each):
  bytes 0-1    d, fp16: the super-block's scale of scales
  bytes 2-3    dmin, fp16: its scale of mins
  bytes 4-15   eight 6-bit sub-block scales `sc` and eight 6-bit mins `m`, packed (see `unpack_scales_mins`)
  bytes 16-143 256 4-bit quants: 4 chunks of 32 bytes; chunk j holds sub-block 2j in its low nibbles and
               sub-block 2j+1 in its high nibbles
and a weight of sub-block s is w = (d * sc[s]) * q - (dmin * m[s]).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SUPER_BLOCK = 256  # weights per Q4_K super-block
GROUP = 32  # weights per sub-block: one scale and one offset
Q4K_BLOCK_BYTES = 144


@dataclass(frozen=True)
class Q4KGroups:
    """A Q4_K matrix as 4-bit groups along K: w[n, k] = scale[n, k // 32] * q[n, k] - offset[n, k // 32]."""

    q: np.ndarray  # [N, K] uint8 in 0..15
    scale: np.ndarray  # [N, K / 32] float32: d * sc, exact (an fp16 times a 6-bit integer)
    offset: np.ndarray  # [N, K / 32] float32: dmin * m, exact

    @property
    def shape(self) -> tuple[int, int]:
        n, k = self.q.shape
        return int(n), int(k)

    def dequantize(self) -> np.ndarray:
        """[N, K] float32, computed as gguf's reference does: (d * sc) * q - dmin * m."""
        n, k = self.shape
        q = self.q.reshape(n, k // GROUP, GROUP).astype(np.float32)
        w = self.scale[:, :, None] * q - self.offset[:, :, None]
        return w.reshape(n, k)


def unpack_scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[B, 12] uint8 -> (sc, m), each [B, 8] uint8 in 0..63.

    Bytes 0-3 hold sc[0..3] in their low 6 bits, bytes 4-7 m[0..3]; bytes 8-11 hold the low 4 bits of
    sc[4..7] (low nibble) and m[4..7] (high nibble), whose top 2 bits are the top bits of bytes 0-3 / 4-7.
    """
    assert packed.ndim == 2 and packed.shape[1] == 12 and packed.dtype == np.uint8, packed.shape
    first_scales, first_mins, low_nibbles = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    high_scales = (low_nibbles & 0x0F) | ((first_scales >> 6) << 4)
    high_mins = (low_nibbles >> 4) | ((first_mins >> 6) << 4)
    sc = np.concatenate([first_scales & 0x3F, high_scales], axis=1)
    m = np.concatenate([first_mins & 0x3F, high_mins], axis=1)
    return sc, m


def unpack_q4k(raw: np.ndarray, n: int, k: int) -> Q4KGroups:
    """The bytes of a Q4_K matrix ([N, K / 256 * 144] uint8, as `gguf.GGUFReader` gives them) -> groups."""
    if k % SUPER_BLOCK:
        raise ValueError(f"a Q4_K row holds whole super-blocks of {SUPER_BLOCK} weights, got K = {k}")
    n_blocks = n * k // SUPER_BLOCK
    blocks = np.ascontiguousarray(raw).reshape(n_blocks, Q4K_BLOCK_BYTES)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)  # [B, 1]
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)  # [B, 1]
    sc, m = unpack_scales_mins(blocks[:, 4:16])  # [B, 8] each
    chunks = blocks[:, 16:].reshape(n_blocks, 4, 32)  # [B, chunk, byte]
    nibbles = np.stack([chunks & 0x0F, chunks >> 4], axis=2)  # [B, chunk, low/high, 32]: sub-block 2j, 2j+1
    q = nibbles.reshape(n, k)
    scale = (d * sc.astype(np.float32)).reshape(n, k // GROUP)
    offset = (dmin * m.astype(np.float32)).reshape(n, k // GROUP)
    return Q4KGroups(q=q, scale=scale, offset=offset)


def concat_rows(parts: list[Q4KGroups]) -> Q4KGroups:
    """Matrices with the same K stacked along N (q, k and v; gate and up): [sum N, K]."""
    return Q4KGroups(
        q=np.concatenate([p.q for p in parts]),
        scale=np.concatenate([p.scale for p in parts]),
        offset=np.concatenate([p.offset for p in parts]),
    )
