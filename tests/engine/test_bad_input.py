"""Bad input gets a clear error before any tensor work, and the engine stays usable."""

from types import SimpleNamespace

import pytest

from engine.generate import Engine
from engine.load import check_same_vocabulary, load_engine
from engine.options import EngineOptions, parse_dtype
from engine.sampling import SamplingParams
from tests.fakes import engine_model_from_hf, tiny_engine, tiny_hf_model


@pytest.fixture(scope="module")
def engine() -> Engine:
    return tiny_engine("qwen2-bias", seed=1, max_seq_len=32)


def test_empty_prompt(engine: Engine) -> None:
    with pytest.raises(ValueError, match="prompt is empty"):
        list(engine.generate([]))


def test_prompt_longer_than_the_cache(engine: Engine) -> None:
    with pytest.raises(ValueError, match="the prompt has 40 tokens but the KV cache holds 32"):
        list(engine.generate(list(range(1, 41))))


@pytest.mark.parametrize("ids", [[1, -1], [1, 10**6], [1, 2.5], ["a"]])
def test_ids_outside_the_vocabulary(engine: Engine, ids: list) -> None:
    with pytest.raises(ValueError, match=r"prompt ids must be integers in \[0, 96\)"):
        list(engine.generate(ids))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -0.5}, "temperature must be >= 0"),
        ({"temperature": float("nan")}, "temperature must be a finite number"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
        ({"top_k": -1}, "top_k must be an integer >= 0"),
        ({"max_new_tokens": 0}, "max_new_tokens must be an integer >= 1"),
        ({"stop": "abc"}, "stop must be a list of strings"),
        ({"stop": ("",)}, "stop strings must be non-empty"),
        ({"seed": "x"}, "seed must be an integer"),
    ],
)
def test_invalid_sampling_values(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_invalid_gamma(engine: Engine) -> None:
    with pytest.raises(ValueError, match="gamma must be an integer >= 0"):
        list(engine.generate([1, 2], gamma=-1))


def test_unknown_model_name() -> None:
    with pytest.raises(ValueError, match="unknown model 'no-such-model'.*qwen2.5-coder-1.5b-instruct"):
        load_engine("no-such-model")


def test_unknown_dtype() -> None:
    with pytest.raises(ValueError, match="unknown dtype 'int3'"):
        parse_dtype("int3")


def test_draft_with_another_vocabulary() -> None:
    target = engine_model_from_hf(tiny_hf_model("llama2"))
    draft = engine_model_from_hf(tiny_hf_model("llama2", vocab_size=100))
    with pytest.raises(ValueError, match="draft's vocabulary .100 ids. differs from the target's .96."):
        Engine(target, draft, tokenizer=None)  # type: ignore[arg-type]


def test_draft_tokenizer_with_other_ids() -> None:
    class Vocab:
        def __init__(self, vocab: dict[str, int]) -> None:
            self.vocab = vocab

        def get_vocab(self) -> dict[str, int]:
            return self.vocab

    with pytest.raises(ValueError, match="tokenizer differs from the target's"):
        check_same_vocabulary(Vocab({"a": 0, "b": 1}), Vocab({"a": 1, "b": 0}))


def test_engine_still_works_after_errors(engine: Engine) -> None:
    for bad in ([], list(range(1, 41))):
        with pytest.raises(ValueError):
            list(engine.generate(bad))
    blocks = list(engine.generate([1, 2, 3], SamplingParams(max_new_tokens=5)))
    assert sum(len(b.token_ids) for b in blocks) == 5


def test_one_stream_per_conversation(engine: Engine) -> None:
    conversation = engine.new_conversation()
    first = conversation.generate([1, 2, 3], SamplingParams(max_new_tokens=5))
    next(first)
    with pytest.raises(RuntimeError, match="already generating"):
        next(conversation.generate([1, 2, 3]))
    first.close()


def test_engine_options_refuse_bad_values_before_any_loading() -> None:
    with pytest.raises(ValueError, match="unknown quantisation 'int3'"):
        EngineOptions("no-such-model", draft_quant="int3")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_seq_len must be >= 2, got 1"):
        load_engine("no-such-model", max_seq_len=1)
    with pytest.raises(ValueError, match="not both"):
        load_engine(EngineOptions("no-such-model"), dtype="fp32")


def test_engine_options_from_flags_and_settings() -> None:
    flags = SimpleNamespace(target="t", draft="none", gamma="auto", dtype="fp32", prompt="unrelated")
    assert EngineOptions.from_attributes(flags) == EngineOptions("t", None, dtype="fp32", gamma="auto")
