"""Timing the forwards the adaptive draft length chooses among, once per engine, on this machine.

A verify's cost by number of ids is what decides whether drafting pays, and it differs by kernel and CPU
(on an AVX2 CPU a bf16 verify of 5 ids costs ~3.8x a step; llama.cpp's 4-bit kernels ~3x; a GPU's ~1x).
Learning it from the blocks alone cannot work: a policy that drafts its maximum only ever sees one size.
So before the first adaptive block the engine times target forwards of a few sizes and one draft step on
scratch caches (its conversations are untouched); the blocks then keep the figures up to date.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.state import Clock, Model, ModelState

CALIBRATION_ROWS = (1, 2, 3, 5, 9)  # sizes timed; the others are interpolated (9 = AUTO_MAX_GAMMA + 1)
CONTEXT = 32  # ids already cached when timing, as after a short prompt
REPEATS = 2  # the fastest of these is kept (the first forward of a size may allocate)


def _scratch(model: Model, n_positions: int) -> ModelState:
    state = ModelState(model, model.new_cache(n_positions))
    vocab = model.args.vocab_size
    state.feed([(1000 + i) % vocab for i in range(CONTEXT)], 0, "none")
    state.valid = CONTEXT
    return state


def _fastest(clock: Clock, state: ModelState, n_ids: int, repeats: int = REPEATS) -> float:
    vocab = state.model.args.vocab_size
    ids = [(2000 + i) % vocab for i in range(n_ids)]
    best = float("inf")
    for _ in range(repeats):
        started = clock()
        state.feed(ids, CONTEXT, "all")  # the same positions each time: a rejected block, rolled back
        best = min(best, clock() - started)
    return best


def measure_costs(
    target: Model, draft: Model | None, clock: Clock, rows: Iterable[int] = CALIBRATION_ROWS
) -> tuple[dict[int, float], float | None]:
    """Seconds of a target forward by number of ids, and of one draft step (None without a draft model)."""
    sizes = sorted(set(rows))
    state = _scratch(target, CONTEXT + sizes[-1] + 1)
    _fastest(clock, state, 1, repeats=1)  # warm-up
    verify_s = {n: _fastest(clock, state, n) for n in sizes}
    draft_step_s = None
    if draft is not None:
        draft_state = _scratch(draft, CONTEXT + 2)
        draft_step_s = _fastest(clock, draft_state, 1, repeats=REPEATS + 1)
    return verify_s, draft_step_s
