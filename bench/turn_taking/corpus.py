"""Write the utterances the end-of-turn head is trained on: what people say to a voice assistant.

`python -m bench.turn_taking.corpus [--per-topic N] [--seed S]` asks the bundled target (sampled,
temperature 0.9) for a numbered list of N things of each of STYLES a person might say to a voice assistant
about each of TOPICS (the reply is started with "1." so that a small model keeps to the list), keeps the
plausible lines (3-30 words, no lists or markup), drops every line whose words are one of the turn-taking
clips' or score_texts.txt's sentences (those are reported on, never trained on), and writes one utterance
a line to bench/turn_taking/turn_corpus.txt (committed: the head is retrained from it, not from a new
sample), a line as it is kept. Progress on stderr, a list a line.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from bench.turn_taking.text_scores import clip_lines

HERE = Path(__file__).parent
CORPUS = HERE / "turn_corpus.txt"

TOPICS = (
    "the weather",
    "cooking and recipes",
    "travel and flights",
    "music",
    "sports scores",
    "shopping lists",
    "reminders and alarms",
    "calendar and meetings",
    "phone calls and messages",
    "directions and traffic",
    "restaurants",
    "movies and TV",
    "history facts",
    "science questions",
    "maths and unit conversions",
    "health and symptoms",
    "fitness and exercise",
    "smart home lights and heating",
    "banking and payments",
    "a customer support call about an internet bill",
    "booking a doctor's appointment",
    "ordering food",
    "a delivery that is late",
    "learning a language",
    "homework help",
    "news",
    "jokes and small talk",
    "gardening",
    "pets",
    "cars and repairs",
    "hotel bookings",
    "timers in the kitchen",
    "spelling and words",
    "geography",
    "the time in other cities",
    "podcasts and audiobooks",
    "a lost password",
    "insurance claims",
    "train and bus times",
    "birthday plans",
    "gift ideas",
    "cleaning tips",
    "job interviews",
    "email writing",
    "translation",
    "sleep and relaxation",
    "a return or refund",
    "a phone plan upgrade",
    "movie showtimes",
    "the stock market",
    "space and planets",
    "animals",
    "books and authors",
    "famous people",
    "home repairs",
    "dictating a phone number or an address",
    "a pharmacy prescription",
    "parking",
    "a car rental",
    "a wedding",
    "a child's school",
    "video games",
    "coffee orders",
    "tax questions",
)
STYLES = (
    "questions",
    "requests and commands, some polite and long, some short",
    "things said in one or two sentences, telling the assistant something and then asking for help",
)
PROMPT = (
    "Write a numbered list of {n} different {style} that a person might say out loud to a voice assistant "
    "about {topic}. Vary their length from 3 to 25 words. Write each one as spoken, with normal punctuation."
)
_NUMBERING = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s*")
_WORD = re.compile(r"[A-Za-z0-9']+")


def words_key(text: str) -> str:
    """A sentence's lowercased words: the key that keeps the reported sentences out of training."""
    return " ".join(_WORD.findall(text.lower().replace("|", " ")))


def held_out_keys() -> set[str]:
    """The sentences reported on (the clips' and score_texts.txt's), as `words_key`s."""
    lines = clip_lines() + (HERE / "score_texts.txt").read_text().splitlines()
    return {words_key(line) for line in lines if line.strip()}


def clean_line(line: str) -> str | None:
    """One generated line as an utterance, or None if it does not read like one."""
    text = _NUMBERING.sub("", line).strip().strip('"').strip()
    if not 3 <= len(text.split()) <= 30 or not text.isascii() or any(c in text for c in "#*:`[]{}<>|_=/\\"):
        return None
    if not text[0].isalpha() or text.lower().startswith(("sure", "here are", "certainly", "note")):
        return None
    return text


def main() -> None:
    from engine import SamplingParams, chat_prompt
    from voiceagent.config import Settings
    from voiceagent.llm import load_local_engine

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-topic", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=CORPUS)
    args = parser.parse_args()
    engine = load_local_engine(Settings())
    held_out = held_out_keys()
    kept: dict[str, str] = {}
    jobs = [(topic, style) for style in STYLES for topic in TOPICS]  # every topic once before the next style
    args.out.write_text("")
    for i, (topic, style) in enumerate(jobs):
        messages = [{"role": "user", "content": PROMPT.format(n=args.per_topic, style=style, topic=topic)}]
        prompt = chat_prompt(engine.tokenizer, messages) + engine.tokenizer.encode(
            "1.", add_special_tokens=False
        )
        params = SamplingParams(
            temperature=0.9, top_p=0.95, max_new_tokens=40 * args.per_topic, seed=args.seed + i
        )
        reply = "1." + "".join(block.text for block in engine.generate(prompt, params))
        new = 0
        for line in reply.splitlines():
            text = clean_line(line)
            if text is None or words_key(text) in held_out or words_key(text) in kept:
                continue
            kept[words_key(text)] = text
            new += 1
            with args.out.open("a") as out:  # as it goes: a run stopped early keeps what it wrote
                out.write(text + "\n")
        print(
            f"[{i + 1}/{len(jobs)}] {topic}, {style[:20]}: {new} new, {len(kept)} in all",
            file=sys.stderr,
            flush=True,
        )
    print(f"wrote {len(kept)} utterances to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
