"""Fixed-shape decode forwards (CUDA graphs on a GPU): the same tokens as the dynamic path.

On the CPU the static forwards run eagerly, which checks their logic (static buffers, attending the whole
cache under the causal mask, one forward per shape per cache). The `gpu` tests capture real CUDA graphs.
"""

import pytest
import torch

from engine.generate import Engine
from engine.graphs import StaticForward
from engine.sampling import SamplingParams
from tests.fakes import engine_model_from_hf, tiny_engine, tiny_hf_model


def ids(engine: Engine, prompt: list[int], params: SamplingParams, gamma: int | str = 4) -> list[int]:
    return [t for b in engine.new_conversation().generate(prompt, params, gamma=gamma) for t in b.token_ids]


def pair(static_shapes: bool, **kwargs: object) -> Engine:
    engine = tiny_engine("mistral-sliding-window", seed=8, init_std=0.1, draft_noise=0.15, **kwargs)  # type: ignore[arg-type]
    engine.static_shapes = static_shapes
    return engine


@pytest.mark.parametrize("gamma", [3, "auto"])
def test_static_shapes_give_the_same_greedy_tokens(gamma: int | str) -> None:
    dynamic, static = pair(False), pair(True)
    params = SamplingParams(max_new_tokens=48)
    for prompt in ([1, 2, 3], list(range(5, 40))):
        assert ids(static, prompt, params, gamma) == ids(dynamic, prompt, params, gamma)


def test_static_shapes_give_the_same_samples() -> None:
    dynamic, static = pair(False), pair(True)
    params = SamplingParams(temperature=0.9, top_k=20, max_new_tokens=30, seed=5)
    assert ids(static, [4, 4, 4], params) == ids(dynamic, [4, 4, 4], params)


def test_static_conversation_reuse_and_truncate() -> None:
    dynamic, static = pair(False), pair(True)
    params = SamplingParams(max_new_tokens=20)
    results = []
    for engine in (dynamic, static):
        conversation = engine.new_conversation()
        list(conversation.generate([9, 8, 7], params))
        conversation.truncate(10)
        follow_up = [*conversation.tokens, 60, 61]
        results.append([t for b in conversation.generate(follow_up, params) for t in b.token_ids])
    assert results[0] == results[1]


def test_one_static_forward_per_shape() -> None:
    engine = pair(True)
    conversation = engine.new_conversation()
    list(conversation.generate([1, 2, 3], SamplingParams(max_new_tokens=30), gamma=3))
    assert conversation.target.static is not None and conversation.draft is not None
    assert conversation.draft.static is not None
    assert set(conversation.draft.static._forwards) <= {(1, "last"), (2, "last")}
    assert (4, "all") in conversation.target.static._forwards


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@gpu
def test_cuda_graph_replay_equals_eager() -> None:
    model = engine_model_from_hf(tiny_hf_model("llama3-rope-scaling", seed=1), max_seq_len=128).cuda()
    cache, reference = model.new_cache(), model.new_cache()
    prompt = torch.randint(0, 96, (20,), device="cuda")
    for c in (cache, reference):
        model(prompt, torch.arange(20, device="cuda"), c, 20, logits="none")
    step = StaticForward(model, cache, 3, "all", capture=True)
    assert step.graph is not None
    tokens = torch.randint(0, 96, (3,), device="cuda")
    got = step(tokens, 20)
    assert got is not None
    expected = model(tokens, torch.arange(20, 23, device="cuda"), reference, 23, logits="all")
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(cache.k[..., :23, :], reference.k[..., :23, :])


@pytest.mark.gpu
@gpu
def test_cuda_engine_is_exact_with_graphs() -> None:
    plain = tiny_engine("qwen2-bias", draft=None, seed=2, init_std=0.1)
    plain.target.cuda()
    speculative = tiny_engine("qwen2-bias", seed=2, init_std=0.1, draft_noise=0.15)
    for model in (speculative.target, speculative.draft):
        assert model is not None
        model.cuda()
    speculative.static_shapes = True
    params = SamplingParams(max_new_tokens=40)
    assert ids(speculative, [3, 1, 4], params) == ids(plain, [3, 1, 4], params)
