"""The native CPU backend: the target's and the draft's GGUF blocks on the engine's own kernels (quant
gguf-a8; the draft's head over its most frequent ids), under the engine's speculation.

Its promise is stronger than the ggml backend's: every row of a forward is computed alone (the kernel's
integer dot products, int8 rounding per row, attention row by row), so a verify's logits equal one-id
steps' bit for bit, and greedy speculative output equals greedy plain output token for token, with no
near-tie allowance.
"""

import pytest
import torch

from engine.cpu_kernels.linear import GgufKernelLinear, SubsetHead
from engine.generate import Engine, ModelState
from engine.ggml import GgmlModel
from engine.gguf_int4 import GgufEmbedding, draft_head_ids
from engine.load import load_engine
from engine.model import Positions, Transformer
from engine.options import EngineOptions
from engine.turn_end import turn_marks, user_words
from tests.support.bundled import DRAFT, QUESTIONS, TARGET, TINY, greedy_ids, question, reply_after_a_score

pytestmark = pytest.mark.bundled


@pytest.fixture(scope="module")
def native() -> Engine:
    return load_engine(TARGET, DRAFT, backend="native", max_seq_len=512, gamma=4)


@pytest.fixture(scope="module")
def native_lookup() -> Engine:
    return load_engine(TARGET, "ngram", backend="native", max_seq_len=512, gamma="auto")


def test_the_target_runs_the_files_blocks_on_the_kernel(native: Engine) -> None:
    """Every matrix of the Q4_K_M target (Q4_K and Q6_K, the head too) is on the kernel: none is dense."""
    model = native.target
    assert isinstance(model, Transformer) and model.quantization == "gguf-a8" and model.dtype == torch.float32
    layers = [m for m in model.modules() if isinstance(m, GgufKernelLinear)]
    assert len(layers) >= 4 * model.args.n_layers + 1  # a fused q, k, v of two types is two layers
    assert {layer.kind for layer in layers} == {"Q4_K", "Q6_K"}
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())


def test_the_draft_runs_on_the_kernels_with_a_head_over_the_frequent_ids(native: Engine) -> None:
    draft = native.draft
    assert isinstance(draft, Transformer) and isinstance(draft.output, SubsetHead)
    end_of_turn = native.tokenizer.convert_tokens_to_ids("<|im_end|>")
    kept = set(draft.output.ids.tolist())
    assert end_of_turn in kept and 0 in kept and len(kept) < draft.args.vocab_size // 2
    assert draft.output.head.kind == "Q4_0"  # the file's Q8_0 head rounded to 4 bits, as its body
    state = ModelState(draft, draft.new_cache(64))
    logits = state.feed(question(native, "Name three colours."), 0, "last")
    assert logits is not None and logits.shape == (1, draft.args.vocab_size)
    outside = torch.ones(draft.args.vocab_size, dtype=torch.bool)
    outside[draft.output.ids] = False
    assert torch.isinf(logits[0, outside]).all() and torch.isfinite(logits[0, ~outside]).all()


def test_the_draft_head_keeps_the_first_ids_and_every_special_in_whole_tiles() -> None:
    ids = draft_head_ids(vocab_size=1000, n_regular=100, first_special=990)
    assert len(ids) % 16 == 0 and list(ids) == sorted(set(ids.tolist()))
    assert set(range(100)) <= set(ids.tolist()) and set(range(990, 1000)) <= set(ids.tolist())


def test_a_verify_s_logits_equal_one_id_steps_bit_for_bit(native: Engine) -> None:
    model = native.target
    prompt = question(native, QUESTIONS[0])
    continuation = greedy_ids(native, prompt, 0, 9)
    steps, verify = ModelState(model, model.new_cache(256)), ModelState(model, model.new_cache(256))
    for state in (steps, verify):
        state.feed(prompt, 0, "none")
    one_by_one = torch.cat([steps.feed([t], len(prompt) + i, "all") for i, t in enumerate(continuation)])
    together = verify.feed(continuation, len(prompt), "all")
    assert together is not None and torch.equal(together, one_by_one)


@pytest.mark.parametrize("text", QUESTIONS[:4])
def test_greedy_speculative_equals_plain_token_for_token(native: Engine, text: str) -> None:
    prompt = question(native, text)
    plain = greedy_ids(native, prompt, 0, 40)
    assert greedy_ids(native, prompt, 4, 40) == plain
    assert greedy_ids(native, prompt, 2, 40) == plain


@pytest.mark.parametrize("text", QUESTIONS[:2])
def test_a_reply_begun_by_the_turn_score_s_forward_is_the_plain_reply(native: Engine, text: str) -> None:
    """The target's end-of-turn score fed the reply's prompt in its forward (a voice reply started in the
    pause): the reply's first token needs no forward of its own, and the reply is the plain one, token for
    token, drafting or not; likewise after the draft's score, whose forward gives the first draft."""
    plain = greedy_ids(native, question(native, text), 0, 24)
    words = user_words(question(native, text.rstrip("?.!")), turn_marks(native.tokenizer).end_of_turn_id)
    alone = native.new_conversation().end_of_turn_probability(words, model="target")
    carrying = native.new_conversation().end_of_turn_probability(
        words, model="target", reply_prompt=question(native, text)
    )
    assert carrying == alone  # the words' row, computed alone in either forward
    ids, forwards, held = reply_after_a_score(native, text, 0, 24)
    assert held and forwards == 0 and ids == plain
    ids, _, held = reply_after_a_score(native, text, 4, 24)
    assert held and ids == plain
    # The draft's score (the voice default): its forward gives the first drafted token as well.
    ids, draft_forwards, held = reply_after_a_score(native, text, 4, 24, model="draft")
    assert held and ids == plain
    assert draft_forwards == 3  # drafts 2, 3 and 4 of the first block; the first came with the score


def test_prompt_lookup_drafts_with_the_adaptive_length_are_exact(
    native: Engine, native_lookup: Engine
) -> None:
    prompt = question(native, "Repeat after me exactly: the quick brown fox jumps over the lazy dog.")
    assert greedy_ids(native_lookup, prompt, "auto", 32) == greedy_ids(native, prompt, 0, 32)
    stats = native_lookup.speculation
    assert stats.calibrated and all((stats.verify_s(n) or 0.0) > 0.0 for n in (1, 5, 9))


def test_native_refuses_what_it_cannot_run() -> None:
    with pytest.raises(ValueError, match="leave quant"):
        EngineOptions(TARGET, backend="native", quant="int4")
    with pytest.raises(ValueError, match="on a GPU use backend 'torch'"):
        EngineOptions(TARGET, backend="native", device="cuda")


def test_a_file_the_kernel_cannot_hold_runs_on_ggml_and_says_so() -> None:
    """SmolLM2 (llama architecture, Q4_1): the native backend loads its target on llama.cpp's kernels."""
    said: list[str] = []
    engine = load_engine(TINY, TINY, backend="native", max_seq_len=256, gamma=4, log=said.append)
    assert isinstance(engine.target, GgmlModel) and isinstance(engine.draft, GgmlModel)
    assert any("llama.cpp's kernels" in line for line in said)
    prompt = question(engine, "Name three colours.")
    assert greedy_ids(engine, prompt, 4, 16) == greedy_ids(engine, prompt, 0, 16)


def test_without_a_compiler_the_native_backend_serves_on_llama_cpp_s_kernels(monkeypatch) -> None:
    """A kernel that cannot be built (no g++ or ninja) costs speed, not service: both models go to ggml."""
    import engine.cpu_kernels as kernels

    def no_build(variant: str = "native") -> None:
        raise RuntimeError("could not build the CPU kernels (no g++)")

    monkeypatch.setattr(kernels, "gguf_mm", no_build)
    said: list[str] = []
    engine = load_engine(TARGET, DRAFT, backend="native", max_seq_len=256, gamma=4, log=said.append)
    assert isinstance(engine.target, GgmlModel) and isinstance(engine.draft, GgmlModel)
    assert any("did not build" in line and "llama.cpp's kernels" in line for line in said)


def test_every_layer_of_both_models_runs_whole_on_the_kernels(native: Engine) -> None:
    for model in (native.target, native.draft):
        assert isinstance(model, Transformer)
        assert all(block.native is not None for block in model.blocks)


def test_a_fused_layer_computes_what_the_pytorch_layer_does(native: Engine) -> None:
    """The same layer both ways on the same rows: outputs and written keys and values agree up to the
    rounding of the element-wise steps (which can move an int8 activation by one step)."""
    model = native.target
    assert isinstance(model, Transformer)
    block = model.blocks[3]
    prompt = question(native, QUESTIONS[1])
    x = model.tok_embeddings(torch.tensor(prompt[:6]))  # [6, dim]
    positions = torch.arange(40, 46)
    at = Positions(positions, model.rope_cos[positions], model.rope_sin[positions], {})
    results = []
    for fused in (True, False):
        cache = model.new_cache(64)
        saved, block.native = block.native, (block.native if fused else None)
        try:
            results.append((block(x, at, cache.k[3], cache.v[3]), cache.k[3].clone(), cache.v[3].clone()))
        finally:
            block.native = saved
    (y_fused, k_fused, v_fused), (y_torch, k_torch, v_torch) = results
    scale = y_torch.abs().max().item()
    torch.testing.assert_close(y_fused, y_torch, rtol=0, atol=0.02 * scale)
    torch.testing.assert_close(k_fused, k_torch, rtol=0, atol=0.02 * k_torch.abs().max().item())
    torch.testing.assert_close(v_fused, v_torch, rtol=0, atol=0.02 * v_torch.abs().max().item())


def test_one_id_embeddings_come_from_a_cache_of_the_same_values(native: Engine) -> None:
    embedding = native.target.tok_embeddings
    assert isinstance(embedding, GgufEmbedding)
    ids = torch.tensor([11, 500, 11, 70000])
    together = embedding(ids)  # [4, dim], dequantised in one call
    for i, token in enumerate(ids.tolist()):
        for _ in range(2):  # a miss, then a hit
            assert torch.equal(embedding(torch.tensor([token]))[0], together[i])
    row = embedding(torch.tensor([500]))
    row.zero_()  # a caller's change does not reach the cache
    assert torch.equal(embedding(torch.tensor([500]))[0], together[1])
