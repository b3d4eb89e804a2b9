"""Adaptive speculation length: decisions from measured costs and acceptance, and still exact."""

from typing import Any

import pytest

from engine.adaptive import (
    AUTO_MAX_GAMMA,
    PROBE_BUDGET,
    PROBE_EVERY,
    RECENT_DRAFTED_BLOCKS,
    DraftLength,
    SpeculationStats,
)
from engine.sampling import SamplingParams
from tests.fakes import tiny_engine


def stats_with(draft_step_s: float, target_step_s: float, acceptance: float) -> SpeculationStats:
    stats = SpeculationStats()
    for _ in range(50):  # settle the running means
        stats.record(0, 0, 0.0, target_step_s)
        stats.record(4, 4, 4 * draft_step_s, target_step_s)
    stats.acceptance.value = acceptance
    return stats


def test_fixed_gamma_always_drafts_gamma() -> None:
    length = DraftLength.parse(3, SpeculationStats())
    assert [length.should_draft(n, 0.01, limit=10) for n in range(5)] == [True, True, True, False, False]
    assert not length.should_draft(1, 1.0, limit=1)  # never past the token budget / cache


def test_auto_drafts_while_the_expected_gain_beats_the_cost() -> None:
    # draft step 10 ms, target step 100 ms, acceptance 0.8: worth it while confidence * 0.8 * 100 > 10
    length = DraftLength.parse("auto", stats_with(0.010, 0.100, 0.8))
    assert length.max_gamma == AUTO_MAX_GAMMA
    assert length.should_draft(0, 1.0, limit=20)
    assert length.should_draft(3, 0.5, limit=20)
    assert not length.should_draft(3, 0.1, limit=20)  # 0.1 * 0.8 * 100 = 8 < 10: the draft is unsure
    assert not length.should_draft(AUTO_MAX_GAMMA, 1.0, limit=20)


def test_auto_falls_back_to_plain_decoding_and_probes_less_and_less() -> None:
    # A cheap draft that is rarely right: drafting does not pay now, but would on more predictable text.
    length = DraftLength.parse("auto", stats_with(0.010, 0.100, 0.05))
    decisions = [length.should_draft(0, 1.0, limit=20) for _ in range(7 * PROBE_EVERY)]
    probes = [i + 1 for i, drafted in enumerate(decisions) if drafted]
    assert probes == [PROBE_EVERY, 3 * PROBE_EVERY, 7 * PROBE_EVERY]  # 8, then 16, then 32 blocks apart
    length.acceptance.value = 0.9  # the text became predictable (a probe was accepted)
    assert length.should_draft(0, 1.0, limit=20) and length.stats.probe_every == PROBE_EVERY


def test_auto_never_probes_where_drafting_cannot_pay() -> None:
    # A draft as slow as the target: even a draft that is always right would not pay.
    length = DraftLength.parse("auto", stats_with(0.100, 0.100, 0.2))
    assert not any(length.should_draft(0, 1.0, limit=20) for _ in range(10 * PROBE_EVERY))


def test_a_probe_waits_until_it_fits_the_probe_budget() -> None:
    """Where drafting does not pay, a probe's catch-up (the draft fed every id since it last ran) may cost
    several steps: probes wait until what they cost stays within PROBE_BUDGET of the blocks' time."""
    stats = SpeculationStats()
    stats.calibrate({1: 0.040, 2: 0.060, 9: 0.300}, draft_step_s=0.010)  # a CPU's costs
    stats.acceptance.value = 0.05  # drafting does not pay now, but would on predictable text
    length = DraftLength.parse("auto", stats)
    due = []
    for _ in range(40):  # 40 plain steps of 40 ms: 1.6 s of blocks, a budget of 32 ms
        due.append(length.should_draft(0, 1.0, limit=20, catch_up_ids=60))
        stats.record(0, 0, 0.0, 0.040)
    assert not any(due)  # due from the 8th block on, but 60 ids to catch up on: ~0.6 s expected
    assert PROBE_BUDGET * stats.run_s == pytest.approx(0.032)
    # With nothing to catch up on, a probe costs at most a draft step and a row: 30 ms, affordable now.
    assert length.should_draft(0, 1.0, limit=20, catch_up_ids=0) and stats.probing
    stats.record(1, 0, 0.010, 0.060)  # the probe: rejected, so 70 ms for one token, a step's 40 ms
    assert stats.probe_overhead_s == pytest.approx(0.030) and not stats.probing
    assert not any(length.should_draft(0, 1.0, limit=20) for _ in range(3 * PROBE_EVERY))  # budget spent


def test_a_probe_s_catch_up_is_measured_per_id_and_counted_in_its_cost() -> None:
    stats = SpeculationStats()
    stats.calibrate({1: 0.040, 2: 0.060, 9: 0.300}, draft_step_s=0.010)
    stats.probing = True
    stats.record(1, 1, 0.010, 0.060, catch_up_s=0.300, n_caught_up=60)
    assert stats.catch_up_id_s.value == pytest.approx(0.005)
    assert stats.run_s == pytest.approx(0.370)
    assert stats.probe_overhead_s == pytest.approx(0.370 - 2 * 0.040)  # two tokens committed
    stats.record(1, 1, 0.010, 0.060)  # a block that drafted because drafting paid: not a probe
    assert stats.probe_overhead_s == pytest.approx(0.290)


def test_a_drafted_token_that_cost_no_draft_forward_is_not_a_draft_step() -> None:
    """A first block whose first drafted token came with a turn score's forward (`ModelState.next_logits`):
    its draft time paid for one step fewer than it drafted, and the step's cost stays what it is."""
    stats = SpeculationStats()
    stats.calibrate({1: 0.040, 2: 0.060, 9: 0.300}, draft_step_s=0.010)
    stats.record(2, 2, 0.010, 0.300, n_rows=9, n_draft_forwards=1)  # at the table's pace
    assert stats.draft_step_s() == pytest.approx(0.010)
    stats.record(1, 1, 0.0005, 0.300, n_rows=9, n_draft_forwards=0)  # no draft forward at all
    assert stats.draft_step_s() == pytest.approx(0.010)
    stats.record(2, 2, 0.010, 0.060)  # every drafted token a forward: 5 ms a step, learnt
    assert (stats.draft_step_s() or 0) < 0.010


def test_a_generation_s_probe_measures_its_catch_up_and_stays_exact() -> None:
    auto = tiny_engine("qwen2-bias", seed=6, init_std=0.1, draft_noise=0.15, gamma="auto")
    auto.speculation.calibrate({1: 0.040, 2: 0.060, 9: 0.300}, draft_step_s=0.010)
    auto.speculation.acceptance.value = 0.05  # plain blocks, with probes
    auto.speculation.run_s = 100.0  # an engine that has run a while: probes are affordable
    prompt, params = [1, 2, 3, 4, 5, 6], SamplingParams(max_new_tokens=24)
    blocks = list(auto.new_conversation().generate(prompt, params))
    assert any(b.n_drafted for b in blocks[PROBE_EVERY:])  # a probe came due
    assert auto.speculation.catch_up_id_s.value is not None  # it fed the draft the ids it had not seen
    plain = tiny_engine("qwen2-bias", draft=None, seed=6, init_std=0.1)
    expected = [t for b in plain.new_conversation().generate(prompt, params) for t in b.token_ids]
    assert [t for b in blocks for t in b.token_ids] == expected


def test_auto_stops_drafting_when_drafted_blocks_ran_slower_than_plain_steps() -> None:
    length = DraftLength.parse("auto", stats_with(0.010, 0.100, 0.8))
    assert length.should_draft(0, 1.0, limit=20)  # the cost model says drafting pays
    for _ in range(30):  # ... but blocks of 4 drafts committed 1 token in 0.2 s: twice a plain step
        length.record(4, 0, 0.05, 0.150)
        length.record(0, 0, 0.0, 0.100)
    length.acceptance.value = 0.8
    assert not length.should_draft(0, 1.0, limit=20)
    # That check is the generation's own: the next reply starts from the shared costs and acceptance.
    assert DraftLength.parse("auto", length.stats).should_draft(0, 1.0, limit=20)


def test_one_rejected_block_does_not_stop_drafting_and_an_accepted_probe_resumes_it() -> None:
    """The check weighs a generation's latest drafting blocks by the tokens they committed: a reply's first
    rejected token (a block costing ~1.4 plain steps) stops nothing; after a run of rejections, a probe
    that beats a plain step resumes drafting (the bench's C prompt after a chat answer had stayed plain
    for 61 of 63 blocks)."""
    stats = SpeculationStats()
    stats.calibrate({1: 0.050, 2: 0.055, 4: 0.060}, draft_step_s=0.015)
    stats.run_s = 100.0  # an engine that has run a while: probes are affordable
    length = DraftLength.parse("auto", stats)
    length.record(1, 0, 0.015, 0.055)  # 70 ms for one token against a 50 ms step
    assert length.should_draft(0, 1.0, limit=20)
    for _ in range(RECENT_DRAFTED_BLOCKS):
        length.record(1, 0, 0.015, 0.055)
    length.acceptance.value = 0.7  # the cost model alone would draft: the measured blocks decide
    decisions = [length.should_draft(0, 1.0, limit=20) for _ in range(PROBE_EVERY)]
    assert decisions == [False] * (PROBE_EVERY - 1) + [True] and stats.probing
    length.record(3, 3, 0.045, 0.060)  # the probe: 4 tokens in 105 ms
    assert length.should_draft(0, 1.0, limit=20)


def test_each_generation_starts_from_the_engine_s_long_run_acceptance() -> None:
    """A reply whose text the draft stopped predicting (its acceptance fell to 0) drafts less and less, but
    the next reply starts from the long-run rate, not from that reply's end."""
    stats = SpeculationStats()
    stats.calibrate({1: 0.050, 2: 0.055, 4: 0.060}, draft_step_s=0.015)
    for _ in range(40):
        stats.record(3, 2, 0.045, 0.060)  # earlier replies: acceptance 2/3
    chat = DraftLength.parse("auto", stats)
    assert chat.acceptance.value == pytest.approx(stats.acceptance.value)
    for _ in range(20):
        chat.record(1, 0, 0.015, 0.055)
    assert chat.acceptance.value is not None and chat.acceptance.value < 0.15
    assert not chat.should_draft(0, 1.0, limit=20)
    code = DraftLength.parse("auto", stats)
    assert code.acceptance.value is not None and code.acceptance.value > 0.4
    assert code.should_draft(0, 1.0, limit=20)


def test_the_verify_cost_table_is_interpolated_by_size() -> None:
    stats = SpeculationStats()
    stats.calibrate({1: 0.060, 2: 0.110, 3: 0.150, 5: 0.210, 9: 0.370}, draft_step_s=0.025)
    assert stats.target_step_s() == 0.060 and stats.verify_s(4) == 0.180
    assert abs((stats.verify_s(12) or 0) - 0.490) < 1e-9  # past the largest: the last slope
    stats.record(0, 0, 0.0, 0.070)  # a plain block measured slower than calibrated moves the estimate
    assert 0.060 < (stats.target_step_s() or 0) < 0.070
    pace = stats.pace  # ... as the machine's pace: every size's seconds with it
    assert pace > 1 and abs((stats.verify_s(3) or 0) - 0.150 * pace) < 1e-9
    cost = stats.record(2, 1, 0.05, 0.400, n_rows=66)  # a first block with a 64-id prompt tail: its own size
    assert stats.pace == pace and abs((stats.verify_s(3) or 0) - 0.150 * pace) < 1e-9
    assert cost is None  # nor is its prefill counted as what drafting costs


def test_costs_measured_at_another_pace_of_the_machine_stay_comparable() -> None:
    """Drafting paid while the machine ran slow (steps 100 ms); then it runs 30% faster. Costs kept in
    seconds would compare the drafted blocks' slow seconds with the fast steps and stop drafting for good
    (what a shared AMD EPYC did: steps 27 ms, then 19)."""
    stats = SpeculationStats()
    stats.calibrate({1: 0.100, 2: 0.105, 3: 0.110, 5: 0.125, 9: 0.200}, draft_step_s=0.010)
    length = DraftLength.parse("auto", stats)
    for _ in range(20):  # at the calibrated pace: 4 drafted, 3 accepted, 0.165 s for 4 tokens (0.041 each)
        length.record(4, 3, 0.040, 0.125)
    assert length.should_draft(0, 1.0, limit=20)
    for _ in range(20):  # plain steps at 70 ms: the machine got faster
        stats.record(0, 0, 0.0, 0.070)
    assert stats.pace < 0.8 and abs((stats.target_step_s() or 0) - 0.070) < 0.002
    assert length.should_draft(0, 1.0, limit=20)
    assert (stats.draft_step_s() or 0) < 0.008  # the draft's step follows the same pace
    five = (stats.verify_s(5) or 0) / (stats.verify_s(1) or 1)  # the sizes keep their proportions
    assert 1.25 <= five < 1.4


def test_auto_is_exact_and_adapts_per_block(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = tiny_engine("qwen2-bias", draft=None, seed=6, init_std=0.1)
    auto = tiny_engine("qwen2-bias", seed=6, init_std=0.1, draft_noise=0.15, gamma="auto")
    # Costs of a large target and a small draft (the tiny pair's own are alike: drafting would never pay)
    auto.speculation.calibrate({1: 0.100, 9: 0.100}, draft_step_s=0.010)
    monkeypatch.setattr(auto.speculation, "record", lambda *args, **kwargs: None)
    params = SamplingParams(max_new_tokens=60)
    for prompt in ([1, 2, 3], [7, 70, 17, 71]):
        expected = [t for b in plain.new_conversation().generate(prompt, params) for t in b.token_ids]
        blocks = list(auto.new_conversation().generate(prompt, params))
        assert [t for b in blocks for t in b.token_ids] == expected
        assert len({b.n_drafted for b in blocks}) > 1  # the length changed with the draft's confidence


def test_sampled_auto_runs() -> None:
    auto = tiny_engine("qwen2-bias", seed=6, init_std=0.1, draft_noise=0.15, gamma="auto")
    params = SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=30, seed=1)
    blocks = list(auto.new_conversation().generate([1, 2, 3], params))
    assert sum(len(b.token_ids) for b in blocks) == 30


@pytest.mark.parametrize("grow", [True, False])
def test_the_first_block_drafts_only_where_forwards_do_not_grow_with_their_ids(
    monkeypatch: pytest.MonkeyPatch, grow: bool
) -> None:
    """Compute-bound (a CPU): the first block, whose verify carries the prompt's tail, is a plain step, so
    the first token comes as soon as it can; later blocks draft. Memory-bound (a GPU): it drafts too."""
    auto = tiny_engine("qwen2-bias", seed=6, init_std=0.1, draft_noise=0.15, gamma="auto")
    nine_ids_s = 0.5 if grow else 0.1  # a forward of 9 ids: 5x a step, or as cheap as one
    auto.speculation.calibrate({1: 0.100, 2: 0.100, 9: nine_ids_s}, draft_step_s=0.001)
    auto.speculation.acceptance.value = 0.95
    monkeypatch.setattr(auto.speculation, "record", lambda *args, **kwargs: None)
    assert auto.speculation.forwards_grow_with_ids() is grow
    conversation = auto.new_conversation()
    blocks = list(conversation.generate([1, 2, 3, 4, 5, 6], SamplingParams(max_new_tokens=20)))
    assert (blocks[0].n_drafted == 0) is grow
    assert any(block.n_drafted > 0 for block in blocks[1:])  # drafting pays on these costs
    plain = tiny_engine("qwen2-bias", draft=None, seed=6, init_std=0.1)
    expected = [
        t
        for b in plain.new_conversation().generate([1, 2, 3, 4, 5, 6], SamplingParams(max_new_tokens=20))
        for t in b.token_ids
    ]
    assert [t for b in blocks for t in b.token_ids] == expected


@pytest.mark.parametrize("grow", [True, False])
def test_the_first_plain_tokens_are_plain_steps_only_where_forwards_grow_with_their_ids(
    monkeypatch: pytest.MonkeyPatch, grow: bool
) -> None:
    """`plain_tokens` (a voice reply's first phrase): on a CPU's costs every block until that many tokens
    is a one-token plain step, then drafting resumes; on a GPU's it changes nothing. Output unchanged."""
    auto = tiny_engine("qwen2-bias", seed=6, init_std=0.1, draft_noise=0.15, gamma="auto")
    auto.speculation.calibrate({1: 0.100, 2: 0.100, 9: 0.5 if grow else 0.1}, draft_step_s=0.001)
    auto.speculation.acceptance.value = 0.95
    monkeypatch.setattr(auto.speculation, "record", lambda *args, **kwargs: None)
    prompt, params = [1, 2, 3, 4, 5, 6], SamplingParams(max_new_tokens=24)
    blocks = list(auto.new_conversation().generate(prompt, params, plain_tokens=8))
    first_eight = blocks[:8] if grow else []
    assert all(b.n_drafted == 0 and len(b.token_ids) == 1 for b in first_eight)
    assert any(b.n_drafted > 0 for b in blocks[len(first_eight) :])  # drafting pays on these costs
    if not grow:
        assert any(b.n_drafted > 0 for b in blocks[:3])
    plain = tiny_engine("qwen2-bias", draft=None, seed=6, init_std=0.1)
    expected = [t for b in plain.new_conversation().generate(prompt, params) for t in b.token_ids]
    assert [t for b in blocks for t in b.token_ids] == expected
    with pytest.raises(ValueError, match="plain_tokens"):
        auto.new_conversation().generate(prompt, params, plain_tokens=-1)


def test_time_forwards_are_held_for_speech_is_not_a_cost_the_draft_length_learns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A forward held between layers while a phrase's audio renders (`Engine.pause_between_layers`) is not
    a slower forward: the costs recorded for the adaptive length leave the held time out (a voice session's
    draft steps measured 106-131 ms instead of ~25 while held, and its replies stopped drafting), while
    the block's own timing keeps the wall time."""
    engine = tiny_engine("qwen2-bias", seed=6, init_std=0.1, draft_noise=0.15, gamma=3)
    now = [0.0]  # the engine's clock: only the holds advance it
    engine.clock = lambda: now[0]

    def held() -> None:
        now[0] += 1.0

    engine.pause_between_layers(held)
    recorded: list[tuple[float, float, float]] = []
    record = engine.speculation.record

    def spy(n_drafted: int, n_accepted: int, draft_s: float, verify_s: float, *args: Any, **kw: Any) -> Any:
        recorded.append((draft_s, verify_s, kw.get("catch_up_s", 0.0)))
        return record(n_drafted, n_accepted, draft_s, verify_s, *args, **kw)

    monkeypatch.setattr(engine.speculation, "record", spy)
    blocks = list(engine.new_conversation().generate([1, 2, 3, 4], SamplingParams(max_new_tokens=12)))
    assert engine.paused_s >= len(blocks)  # every block's forwards were held
    assert recorded and all(seconds == (0.0, 0.0, 0.0) for seconds in recorded), recorded
    assert all(b.timing.verify_s >= 1.0 for b in blocks)  # wall time: every verify was held
