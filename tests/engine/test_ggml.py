"""The ggml CPU backend: the bundled GGUF files on llama.cpp's kernels under the engine's own speculation.

Exactness is the engine's promise on every path: greedy speculative output equals greedy plain output of
the same target on the same path, except where the two computations' rounding can flip a near-tie.
"""

import pytest
import torch

from engine.generate import Engine, ModelState
from engine.ggml import extra_buffers_safe
from engine.load import load_engine
from engine.models import converted_dir
from engine.options import EngineOptions
from engine.sampling import SamplingParams
from tests.support.bundled import DRAFT, TARGET, TINY, greedy_ids, plain_path_logits, question
from tests.support.bundled import QUESTIONS as BUNDLED_QUESTIONS

pytestmark = pytest.mark.bundled

QUESTIONS = [BUNDLED_QUESTIONS[i] for i in (0, 2, 3, 5)]


@pytest.fixture(scope="module")
def tiny() -> Engine:
    """SmolLM2 drafting for itself: the draft is always right, so every block is a long verify."""
    return load_engine(TINY, TINY, backend="ggml", max_seq_len=512, gamma=4)


@pytest.fixture(scope="module")
def pair() -> Engine:
    return load_engine(TARGET, DRAFT, backend="ggml", max_seq_len=512, gamma="auto")


def test_a_rolled_back_forward_leaves_no_trace(tiny: Engine) -> None:
    """Ids fed at a position replace whatever was fed there before (a rejected draft)."""
    model = tiny.target
    prompt = question(tiny, "Name three colours.")
    fresh = ModelState(model, model.new_cache())
    fresh.feed(prompt, 0, "none")
    expected = fresh.feed([42, 43], len(prompt), "all")
    reused = ModelState(model, model.new_cache())
    reused.feed(prompt, 0, "none")
    reused.feed([7, 8, 9, 10], len(prompt), "all")  # drafted, then rejected
    got = reused.feed([42, 43], len(prompt), "all")
    assert expected is not None and got is not None
    torch.testing.assert_close(got, expected)


def test_greedy_speculative_equals_plain_on_tiny(tiny: Engine) -> None:
    """Q4_1 weights give the same logits row by row whatever the batch: identical tokens."""
    for text in ("Name three colours.", "Count to ten."):
        prompt = question(tiny, text)
        assert greedy_ids(tiny, prompt, 4, 32) == greedy_ids(tiny, prompt, 0, 32)
    assert tiny.metrics.acceptance_rate > 0.9


def test_a_fork_continues_like_the_original(tiny: Engine) -> None:
    conversation = tiny.new_conversation()
    prompt = question(tiny, "Name three colours.")
    conversation.prefill(prompt)
    fork = conversation.fork()
    params = SamplingParams(max_new_tokens=16)
    original = [t for b in conversation.generate(prompt, params) for t in b.token_ids]
    assert [t for b in fork.generate(prompt, params) for t in b.token_ids] == original


def batch_rounding(engine: Engine, prompt: list[int], continuation: list[int]) -> float:
    """The largest logit difference between one verify of 5 ids and five one-id steps over the same ids:
    on Q4_K weights llama.cpp's kernels for several rows round differently from its one-row kernel."""
    model, n = engine.target, min(5, len(continuation))
    steps, verify = ModelState(model, model.new_cache()), ModelState(model, model.new_cache())
    steps.feed(prompt, 0, "none")
    verify.feed(prompt, 0, "none")
    one_by_one = [steps.feed([t], len(prompt) + i, "all") for i, t in enumerate(continuation[:n])]
    together = verify.feed(continuation[:n], len(prompt), "all")
    assert together is not None and all(row is not None for row in one_by_one)
    return float((torch.cat(one_by_one) - together).abs().max())  # type: ignore[arg-type]


def divergence(engine: Engine, prompt: list[int], plain: list[int], other: list[int]) -> tuple | None:
    """None if `other` is `plain`; else (token, top-2 gap, bound) at the first difference, asserting the
    flip is a near-tie: the plain path's top-2 gap is within what the two computations can differ by
    (twice the largest logit difference measured between a verify and one-id steps there)."""
    first = next((i for i, (a, b) in enumerate(zip(plain, other, strict=False)) if a != b), None)
    if first is None:
        assert other == plain
        return None
    logits = plain_path_logits(engine, prompt, plain[:first])
    assert int(logits.argmax()) == plain[first]
    gap = float(logits.max() - logits[other[first]])
    bound = 2 * batch_rounding(engine, [*prompt, *plain[:first]], other[first:])
    assert gap <= bound, f"divergence at token {first} with a top-2 gap of {gap} > {bound}: not a tie"
    return first, gap, bound


def test_bundled_pair_divergences_are_near_ties(pair: Engine) -> None:
    diverged = []
    for text in QUESTIONS:
        prompt = question(pair, text)
        plain = greedy_ids(pair, prompt, 0, 40)
        found = divergence(pair, prompt, plain, greedy_ids(pair, prompt, 4, 40))
        if found is not None:
            diverged.append(found)
    print(f"\nggml: {len(diverged)}/{len(QUESTIONS)} prompts diverged; (token, gap, bound): {diverged}")
    assert len(diverged) < len(QUESTIONS)


def test_adaptive_length_is_calibrated_at_load_and_exact(pair: Engine) -> None:
    """gamma 'auto' times every verify size it may choose at load; its output is still the target's."""
    stats = pair.speculation
    assert stats.calibrated and {1, 2, 3, 5, 9} <= set(stats.verify)
    assert all((stats.verify_s(n) or 0.0) > 0.0 for n in range(1, 10))
    assert stats.draft_step.value is not None and stats.draft_step.value > 0
    prompt = question(pair, QUESTIONS[1])
    plain = greedy_ids(pair, prompt, 0, 24)
    divergence(pair, prompt, plain, greedy_ids(pair, prompt, "auto", 24))


def test_ggml_refuses_what_it_cannot_run() -> None:
    with pytest.raises(ValueError, match="GGUF files. own weights"):
        EngineOptions(TARGET, backend="ggml", quant="int4")
    with pytest.raises(ValueError, match="unknown backend"):
        EngineOptions(TARGET, backend="onnx")
    with pytest.raises(ValueError, match="GGUF files"):
        load_engine(str(converted_dir(TINY)), backend="ggml")  # a safetensors checkpoint


def test_a_build_with_amx_kernels_runs_on_plain_buffers() -> None:
    """llama.cpp's AMX matmul crashes on the bundled Q4_K weights (a Xeon with AMX, 2026-12-02): a build
    that has it loads the weights into plain CPU buffers instead of its extra (AMX, repacked) ones."""
    amx = "CPU : AVX512 = 1 | AVX512_VNNI = 1 | AMX_INT8 = 1 | REPACK = 1 |"
    assert not extra_buffers_safe(amx)
    assert extra_buffers_safe("CPU : AVX2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | REPACK = 1 |")


def test_make_setup_installed_a_build_without_amx_kernels() -> None:
    """scripts/build-llama-cpp.sh builds llama.cpp without AMX, so the repacked kernels stay in use."""
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode()
    assert extra_buffers_safe(info), info


def test_a_verify_sized_forward_matches_one_id_forwards(tiny: Engine) -> None:
    """A forward of several ids (a verify, a prefill: where the AMX build crashed) gives each position the
    logits that feeding the ids one at a time gives, up to the kernels' rounding."""
    model = tiny.target
    prompt = question(tiny, "Name three colours.")
    ids = [42, 43, 44, 45, 46]
    batched_state = ModelState(model, model.new_cache())
    batched_state.feed(prompt, 0, "none")
    batched = batched_state.feed(ids, len(prompt), "all")
    single_state = ModelState(model, model.new_cache())
    single_state.feed(prompt, 0, "none")
    singles = torch.cat([single_state.feed([t], len(prompt) + i, "all") for i, t in enumerate(ids)])
    assert batched is not None and batched.shape == singles.shape == (len(ids), batched.shape[1])
    assert torch.equal(batched.argmax(dim=-1), singles.argmax(dim=-1))
    assert torch.allclose(batched, singles, atol=0.5, rtol=0)
