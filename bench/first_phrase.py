"""How many target steps a spoken reply's first phrase waits for: the bundled target's greedy replies to the
voice bench's questions (bench/voice_questions.txt, under the voice agent's system prompt), one token a
block as the engine commits a reply's first phrase (engine/generate.py, `plain_tokens`), through the phrase
chunker the voice agent uses.

    python -m bench.first_phrase [--limit 16] [--max-new-tokens 24]

Per reply: the tokens committed when the chunker gives out the first phrase, and when the whitespace after
that phrase arrived, which is what a chunker that waits for it (before 2026-12-03) waited for. Counts, not
times, so they hold on any CPU; a step costs ~38 ms on the AVX-512 EPYC and ~110 ms on the AMX Xeon
(README, Measured figures). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from typing import Any

from engine import SamplingParams
from engine.bench.cpu_backends import cpu_description
from engine.bundled import DEFAULT_TARGET
from engine.load import chat_prompt, load_engine
from voiceagent.bench import DEFAULT_QUESTIONS
from voiceagent.chunker import PhraseChunker
from voiceagent.session_options import SessionOptions


def first_phrase_tokens(texts: list[str]) -> tuple[str, int, int]:
    """The first phrase of a reply committed as `texts` (one per token), the number of tokens committed
    when the chunker gave it out, and when the whitespace after its words had arrived (or the reply's end)."""
    chunker = PhraseChunker()
    phrase, out_at = "", len(texts)
    for i, text in enumerate(texts, start=1):
        phrases = chunker.push(text)
        if phrases:
            phrase, out_at = phrases[0], i
            break
    else:
        phrase = (chunker.flush() or [""])[0]
    n_words = max(1, len(phrase.split()))
    followed = re.compile(rf"\s*(?:\S+\s+){{{n_words}}}")
    spaced_at = next(
        (i for i in range(out_at, len(texts) + 1) if followed.match("".join(texts[:i]))), len(texts)
    )
    return phrase, out_at, spaced_at


def run(args: argparse.Namespace) -> dict[str, Any]:
    engine = load_engine(args.target, None, backend=args.backend, max_seq_len=2048)
    system = SessionOptions().system_prompt
    questions = [line.strip() for line in Path(args.questions).read_text().splitlines() if line.strip()]
    rows = []
    for question in questions[: args.limit]:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        prompt = chat_prompt(engine.tokenizer, messages)
        params = SamplingParams(max_new_tokens=args.max_new_tokens)
        blocks = engine.new_conversation().generate(prompt, params, gamma=0)
        texts = [block.text for block in blocks]  # plain decoding: one token a block
        phrase, out_at, spaced_at = first_phrase_tokens(texts)
        row = {"question": question, "phrase": phrase, "tokens": out_at, "waiting_for_space": spaced_at}
        rows.append(row)
        print(f"{out_at:3d} {spaced_at:3d}  {phrase!r:40}  <- {question}", flush=True)
    tokens = [row["tokens"] for row in rows]
    spaced = [row["waiting_for_space"] for row in rows]
    return {
        "machine": cpu_description(),
        "replies": len(rows),
        "first_phrase_tokens_mean": statistics.mean(tokens),
        "first_phrase_tokens_p50": statistics.median(tokens),
        "waiting_for_space_mean": statistics.mean(spaced),
        "waiting_for_space_p50": statistics.median(spaced),
        "replies_a_step_sooner": sum(s > t for s, t in zip(spaced, tokens, strict=True)),
        "rows": rows,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--backend", default="ggml")
    parser.add_argument("--questions", default=DEFAULT_QUESTIONS, type=Path)
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    print(json.dumps(run(parser.parse_args())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
