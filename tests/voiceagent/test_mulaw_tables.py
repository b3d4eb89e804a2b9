"""mu-law by lookup table (the gateway's hot path for phone audio) gives exactly the G.711 formula's codes."""

from __future__ import annotations

import timeit

import numpy as np

from voiceagent.audio import _mulaw_decode_formula, _mulaw_encode_formula, mulaw_decode, mulaw_encode


def test_the_tables_match_the_formulas_for_every_input() -> None:
    every_sample = np.arange(-32768, 32768, dtype=np.int64).astype(np.int16)
    assert mulaw_encode(every_sample) == _mulaw_encode_formula(every_sample).tobytes()
    every_code = np.arange(256, dtype=np.uint8)
    assert np.array_equal(mulaw_decode(every_code.tobytes()), _mulaw_decode_formula(every_code))
    assert mulaw_decode(every_code.tobytes()).dtype == np.int16


def test_encoding_takes_any_int16_array_and_a_20_ms_frame_is_cheap() -> None:
    frame = (8000 * np.sin(np.arange(160) / 3)).astype(np.int16)
    assert mulaw_encode(frame[::2]) == _mulaw_encode_formula(frame[::2]).tobytes()  # not contiguous
    table = timeit.timeit(lambda: mulaw_decode(mulaw_encode(frame)), number=2000)
    formula = timeit.timeit(lambda: _mulaw_decode_formula(_mulaw_encode_formula(frame)), number=2000)
    assert table < formula, (table, formula)
