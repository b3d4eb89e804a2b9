"""The bundled offline pair: exact greedy speculative output, bf16 divergences explained, memory, CLI.

These load the real models that `make setup` assembles (Qwen2.5-Coder 1.5B target, 0.5B draft).
"""

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from engine.generate import Engine
from engine.load import chat_prompt, load_engine, load_tokenizer
from engine.models import converted_dir
from engine.weights import load_checkpoint
from tests.support.bundled import DRAFT, QUESTIONS, TARGET, TINY, greedy_ids, plain_path_logits

pytestmark = pytest.mark.bundled

REPO = Path(__file__).resolve().parents[2]


def prompts(engine: Engine, questions: list[str]) -> Iterator[list[int]]:
    for question in questions:
        yield chat_prompt(engine.tokenizer, [{"role": "user", "content": question}])


@pytest.fixture(scope="module")
def fp32_pair() -> Engine:
    return load_engine(TARGET, DRAFT, dtype="fp32", max_seq_len=512)


@pytest.fixture(scope="module")
def bf16_pair() -> Engine:
    return load_engine(TARGET, DRAFT, dtype="bf16", max_seq_len=512)


def test_fp32_speculative_equals_the_target_alone(fp32_pair: Engine) -> None:
    """In fp32 the verify pass and the one-token steps agree closely enough: identical tokens."""
    for prompt in prompts(fp32_pair, QUESTIONS[:3]):
        plain = greedy_ids(fp32_pair, prompt, gamma=0, n=32)
        assert greedy_ids(fp32_pair, prompt, gamma=4, n=32) == plain
    assert fp32_pair.metrics.acceptance_rate > 0.3


def bf16_step(logit: float) -> float:
    """The spacing of bf16 numbers around `logit` (8 significant bits)."""
    return 2.0 ** (math.floor(math.log2(abs(logit))) - 7)


def test_bf16_divergences_are_near_ties(bf16_pair: Engine) -> None:
    """In bf16 a verify over several positions rounds differently from a one-token step, which can flip
    a greedy choice where the target's top two logits are within bf16 rounding of each other. Every
    divergence must be such a near-tie; anything else would be a bug."""
    diverged, report = 0, []
    for prompt in prompts(bf16_pair, QUESTIONS):
        plain = greedy_ids(bf16_pair, prompt, gamma=0, n=40)
        speculative = greedy_ids(bf16_pair, prompt, gamma=4, n=40)
        first = next((i for i, (a, b) in enumerate(zip(plain, speculative, strict=False)) if a != b), None)
        if first is None:
            assert speculative == plain
            continue
        diverged += 1
        logits = plain_path_logits(bf16_pair, prompt, plain[:first])
        best = float(logits.max())
        gap = best - float(logits[speculative[first]])
        report.append((first, gap, bf16_step(best)))
        assert int(logits.argmax()) == plain[first]
        assert gap <= 2 * bf16_step(best), f"divergence at token {first} with a gap of {gap}: not a near-tie"
    print(f"\nbf16: {diverged}/{len(QUESTIONS)} prompts diverged; (token, top-2 gap, bf16 step): {report}")
    assert bf16_pair.metrics.acceptance_rate > 0.3


def test_real_checkpoint_logits_equal_transformers() -> None:
    """The converted SmolLM2 checkpoint gives transformers' logits in the engine (fp32)."""
    from transformers import AutoModelForCausalLM

    path = converted_dir(TINY)
    reference = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    model = load_checkpoint(path, max_seq_len=64, dtype=torch.float32)
    ids = load_tokenizer(path).encode("The quick brown fox jumps over the lazy dog because")
    with torch.no_grad():
        expected = reference(torch.tensor([ids])).logits[0]
    got = model(torch.tensor(ids), torch.arange(len(ids)), model.new_cache(), kv_len=len(ids))
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engine", *args], capture_output=True, text=True, cwd=REPO, timeout=600
    )


def test_cli_generate_json() -> None:
    common = [
        "generate",
        "--target",
        TINY,
        "--greedy",
        "--chat",
        "--max-new-tokens",
        "24",
        "--json",
        "--dtype",
        "fp32",
        "--prompt",
        "Name three colours.",
    ]
    plain = run_cli(*common, "--draft", "none")
    speculative = run_cli(*common, "--draft", TINY, "--gamma", "3")
    assert plain.returncode == 0 and speculative.returncode == 0, plain.stderr + speculative.stderr
    results = [json.loads(run.stdout.strip().splitlines()[-1]) for run in (plain, speculative)]
    for result in results:
        assert {
            "text",
            "token_ids",
            "n_tokens",
            "tokens_per_s",
            "acceptance_rate",
            "mean_accepted_len",
        } <= set(result)
        assert result["n_tokens"] == len(result["token_ids"]) > 0 and result["text"].strip()
    assert results[1]["token_ids"] == results[0]["token_ids"]
    assert results[1]["acceptance_rate"] > 0.9  # the model drafting for itself
    assert results[0]["text"] in speculative.stdout  # the text was streamed before the JSON line


def test_cli_errors_are_messages_not_tracebacks() -> None:
    run = run_cli("generate", "--target", "no-such-model", "--prompt", "hi")
    assert run.returncode == 2 and "error: unknown model 'no-such-model'" in run.stderr
    assert "Traceback" not in run.stderr
    run = run_cli("generate", "--target", TINY, "--draft", "none", "--top-p", "2", "--prompt", "hi")
    assert run.returncode == 2 and "top_p must be in (0, 1]" in run.stderr


MEMORY_PROBE = f"""
import json
from engine.load import load_engine
from engine.sampling import SamplingParams
engine = load_engine("{TARGET}", "{DRAFT}", dtype="bf16", max_seq_len=4096)
list(engine.generate(list(range(1000, 1200)), SamplingParams(max_new_tokens=8)))
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(json.dumps({{"rss_kb": int(status["VmRSS"].split()[0]), "peak_kb": int(status["VmHWM"].split()[0])}}))
"""


def test_bundled_pair_in_bf16_stays_under_6_gb() -> None:
    """Resident memory after loading both models and generating (weights 4.8 GB: the heads are untied)."""
    run = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert run.returncode == 0, run.stderr
    memory = json.loads(run.stdout.strip().splitlines()[-1])
    print(
        f"\nbf16 pair, 4096-token caches: RSS {memory['rss_kb'] / 2**20:.2f} GiB, "
        f"peak {memory['peak_kb'] / 2**20:.2f} GiB"
    )
    assert memory["rss_kb"] * 1024 < 6e9  # 6 GB


def test_cli_bench_compares_plain_and_speculative(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Count to five."}\n{"prompt": "Say hello in French."}\n')
    run = run_cli(
        "bench",
        "--target",
        TINY,
        "--draft",
        TINY,
        "--prompts",
        str(prompts),
        "--max-new-tokens",
        "12",
        "--dtype",
        "fp32",
    )
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert {"ar_tok_s", "spec_tok_s", "speedup", "acceptance_rate", "mean_accepted_len"} <= set(summary)
    assert summary["greedy_match"] is True and len(summary["rows"]) == 2
    assert summary["acceptance_rate"] > 0.9


def test_cli_bench_rejects_a_bad_prompt_file(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"text": "no prompt field"}\n')
    run = run_cli("bench", "--target", TINY, "--draft", TINY, "--prompts", str(prompts))
    assert run.returncode == 2 and "needs a string field 'prompt'" in run.stderr
