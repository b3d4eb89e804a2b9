"""What a voice reply's first committed block costs in the engine alone, and why: the voice bench's questions
(bench/voice_questions.txt) under the voice agent's system prompt, their words fed ahead word by word as the
session does while the user speaks (`Conversation.prefill`, the draft and on a CPU the target), the pause
partial's end-of-turn score of the whole words, then the reply generated as `LocalLLM` asks for it
(`plain_tokens`), timed to its first block and to the first phrase the voice agent's chunker gives out
(what TTS starts on). Two arms alternate per question: the score apart from the reply ("apart"), and the
score's forward carrying the reply's prompt ("carried", what the session asks: the reply then starts from
that forward's last row, engine/turn_end.py); `pause_to_block_ms` is the score and the first block.

    python -m bench.first_block [--limit 16] [--repeat 2]

Per question: the prompt ids the reply still had to feed (the last word or two, the mark, and the chat
template's end of turn and the assistant's header: they cannot be fed before the words are known), the
first block's draft and verify times, and beside them a target forward of one id and one of as many ids as
that first verify carried, after as many cached ids (`Conversation.target.feed`). What the first block
waits for on a CPU is that forward: its rows are compute-bound where a one-id step is bound by reading the
weights. The voice pipeline adds the pause partial before it (the quiet tail and a recogniser pass) and the
final transcript's check. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from engine import Engine, SamplingParams
from engine.bench.cpu_backends import cpu_description
from engine.engine_thread import on_engine_thread
from engine.load import chat_prompt
from engine.turn_end import turn_marks, user_words
from voiceagent.bench import DEFAULT_QUESTIONS
from voiceagent.chunker import PhraseChunker
from voiceagent.config import Settings
from voiceagent.llm import END_MARKS, FIRST_PHRASE_TOKENS, load_local_engine
from voiceagent.session_options import SPEECH_SYSTEM_PROMPT

SYSTEM = [{"role": "system", "content": SPEECH_SYSTEM_PROMPT}]
SCORE_MODEL = Settings().turn_score_model  # whose cache scores the pause partial in a voice session
ARMS = (False, True)  # the pause partial's score apart from the reply, and carrying the reply's prompt


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--limit", type=int, default=16, help="at most this many questions")
    parser.add_argument("--repeat", type=int, default=2, help="times each question is timed (median)")
    return parser.parse_args(argv)


def forward_ms(engine: Engine, cached: list[int], n_ids: int, repeat: int) -> float:
    """A target forward of `n_ids` ids after `cached` (the median of `repeat`, after one untimed)."""
    conversation = engine.new_conversation()
    conversation.target.feed(cached, 0, "none")
    times = []
    for _ in range(repeat + 1):
        started = time.perf_counter()
        conversation.target.feed(list(range(1000, 1000 + n_ids)), len(cached), "last")
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:]) * 1e3


def first_block(engine: Engine, base: Any, question: str, carried: bool) -> dict[str, Any]:
    """One question: its words fed ahead, the pause partial's end-of-turn score (`carried`: its forward
    carrying the reply's prompt, as the session asks), then the reply's first block (times in ms)."""
    tokenizer = engine.tokenizer
    end_of_turn = turn_marks(tokenizer).end_of_turn_id
    conversation = base.fork()
    words = question.split()
    for n in range(1, len(words)):  # the partials' words, as the user speaks
        said = chat_prompt(tokenizer, [*SYSTEM, {"role": "user", "content": " ".join(words[:n])}])
        conversation.prefill(user_words(said, end_of_turn), draft_only=True)
    prompt = chat_prompt(tokenizer, [*SYSTEM, {"role": "user", "content": question}])
    heard = chat_prompt(tokenizer, [*SYSTEM, {"role": "user", "content": question.rstrip(END_MARKS)}])
    scored = time.perf_counter()
    conversation.end_of_turn_probability(
        user_words(heard, end_of_turn), model=SCORE_MODEL, reply_prompt=prompt if carried else None
    )
    score_ms = (time.perf_counter() - scored) * 1e3
    cached = conversation.target.valid
    started = time.perf_counter()
    blocks = conversation.generate(
        prompt, SamplingParams(0.0, 1.0, 0, 32, (), None), plain_tokens=FIRST_PHRASE_TOKENS
    )
    block = next(blocks)
    total_ms = (time.perf_counter() - started) * 1e3
    chunker, phrase, later = PhraseChunker(), [], block
    while not (phrase := chunker.push(later.text)) and later.finish_reason is None:
        later = next(blocks)
    phrase_ms = (time.perf_counter() - started) * 1e3
    blocks.close()
    return {
        "question": question,
        "carried": carried,
        "score_ms": round(score_ms, 1),
        "pause_to_block_ms": round(score_ms + total_ms, 1),
        "prompt_ids": len(prompt),
        "tail_ids": len(prompt) - cached,  # fed with the first verify (the last one is its first row)
        "first_block_ms": round(total_ms, 1),
        "draft_ms": round(block.timing.draft_s * 1e3, 1),
        "verify_ms": round(block.timing.verify_s * 1e3, 1),
        "n_drafted": block.n_drafted,
        "tokens": len(block.token_ids),
        "first_phrase_ms": round(phrase_ms, 1),  # when the voice agent's chunker gave its first phrase
        "first_phrase": (phrase or chunker.flush() or [""])[0],
    }


@on_engine_thread  # every forward and kernel call on one thread (engine/engine_thread.py)
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    engine = load_local_engine(Settings())
    tokenizer = engine.tokenizer
    base = engine.new_conversation()
    warm = chat_prompt(tokenizer, [*SYSTEM, {"role": "user", "content": "Hi"}])
    base.prefill(user_words(warm, turn_marks(tokenizer).end_of_turn_id))  # the system prompt, warmed
    questions = DEFAULT_QUESTIONS.read_text().splitlines()[: args.limit]
    first_block(engine, base, questions[0], carried=True)  # untimed: first calls allocate
    rows = []
    for question in questions:
        runs = [first_block(engine, base, question, carried) for _ in range(args.repeat) for carried in ARMS]
        for carried in ARMS:  # the two arms alternate, so a shared machine's drift hits both alike
            mine = [r for r in runs if r["carried"] == carried]
            row = min(mine, key=lambda r: r["first_block_ms"])
            for key in ("score_ms", "first_block_ms", "pause_to_block_ms", "first_phrase_ms"):
                row[key] = statistics.median(r[key] for r in mine)
            rows.append(row)
            print(
                f"{'carried' if carried else 'apart  '} score {row['score_ms']:5.1f} + first block "
                f"{row['first_block_ms']:6.1f} ms (draft {row['draft_ms']:5.1f}, "
                f"verify {row['verify_ms']:5.1f}; "
                f"{row['tail_ids']} ids to feed, {row['n_drafted']} drafted); first phrase "
                f"{row['first_phrase_ms']:5.0f} ms {row['first_phrase']!r}; {question}",
                flush=True,
            )
    cached = rows[0]["prompt_ids"] - rows[0]["tail_ids"]
    tails = sorted({r["tail_ids"] + r["n_drafted"] for r in rows})
    forwards = {n: round(forward_ms(engine, list(range(2000, 2000 + cached)), n, args.repeat + 2), 1)
                for n in sorted({1, *tails})}  # fmt: skip
    for n, ms in forwards.items():
        print(f"target forward of {n:2d} ids after {cached}: {ms:6.1f} ms", flush=True)
    by_arm = {
        "carried" if carried else "apart": {
            f"{key}_p50": statistics.median(r[key] for r in rows if r["carried"] == carried)
            for key in ("score_ms", "first_block_ms", "pause_to_block_ms", "first_phrase_ms")
        }
        for carried in ARMS
    }
    for arm, figures in by_arm.items():
        print(f"{arm}: " + ", ".join(f"{key} {value:.1f}" for key, value in figures.items()), flush=True)
    summary = {
        "cpu": cpu_description(),
        **by_arm,
        "tail_ids_p50": statistics.median(r["tail_ids"] for r in rows),
        "forward_ms_by_ids": forwards,
        "questions": rows,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
