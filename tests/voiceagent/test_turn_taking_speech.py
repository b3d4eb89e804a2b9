"""Turn-taking on spoken audio (issue 14): espeak-ng's voice through the default pipeline (Silero, the
session's recognisers, the bundled pair's end-of-turn score, the reply and its speech), driven at real time.

- a sentence with a pause in the middle ("Could you remind me to call" ... 0.8 s ... "my sister after
  lunch") is heard as one turn: the silence rule (320 ms) would cut it there;
- "Okay." spoken over the agent's reply holds the reply and then resumes it: not interrupted, not answered.

Bounds are on outcomes (turns, trace events, words), not on time: they must hold on a slow 2-core CPU.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fakes import espeak_speech, silence
from tests.gateway.helpers import RecordingPipeline
from voiceagent.config import Settings
from voiceagent.pipeline import Pipeline
from voiceagent.session import SessionOptions
from voiceagent.talk import talk

pytestmark = pytest.mark.bundled


@pytest.fixture(scope="module")
def pipeline() -> Pipeline:
    """The default pipeline (the bundled pair scores the end of turn), with espeak-ng's voice for replies."""
    loaded = Pipeline.load(Settings(tts="espeak"), log=lambda message: None)
    asyncio.run(loaded.warm_up())
    return loaded


def _talk(pipeline: Pipeline, audio: np.ndarray, tmp_path: Path) -> tuple[Any, list[dict[str, Any]]]:
    recording = RecordingPipeline(pipeline)
    trace_path = tmp_path / "trace.jsonl"
    options = SessionOptions(output_rate=16000)
    result = asyncio.run(talk(audio, recording, trace_path=trace_path, options=options))  # type: ignore[arg-type]
    records = [json.loads(line) for line in trace_path.read_text().splitlines()]
    return result, records


def test_a_sentence_paused_mid_way_is_heard_as_one_turn(pipeline: Pipeline, tmp_path: Path) -> None:
    audio = np.concatenate(
        [
            silence(0.4),
            espeak_speech("Could you remind me to call", tmp_path),
            silence(0.8),
            espeak_speech("my sister after lunch", tmp_path),
        ]
    )
    _, records = _talk(pipeline, audio, tmp_path)
    finals = [r["text"] for r in records if r["event"] == "asr.final"]
    assert len(finals) == 1, finals  # one turn, not two
    heard = finals[0].lower()
    assert "remind" in heard and "sister" in heard, heard
    scored = [r for r in records if r["event"] == "turn.score"]
    assert scored, "the end of turn was not scored"
    ends = [r for r in records if r["event"] == "vad.speech_end"]
    assert len(ends) == 1


def test_okay_over_the_reply_resumes_it(pipeline: Pipeline, tmp_path: Path) -> None:
    question = espeak_speech("Tell me a story about a little cat who lives in Paris.", tmp_path)
    audio = np.concatenate(
        [silence(0.4), question, silence(2.0), espeak_speech("Okay.", tmp_path), silence(0.5)]
    )
    _, records = _talk(pipeline, audio, tmp_path)
    events = [r["event"] for r in records]
    assert "turn.paused" in events, events
    resumed = [r for r in records if r["event"] == "turn.resumed"]
    # Resumed on the final ("backchannel", "no words"), or, where the final of "Okay." comes more than
    # `resume_after_ms` after its start (a loaded CPU: CI's fresh clone once), on the timeout: the issue's
    # "no real words within ~1 s". Either way the reply goes on, and the late final is not answered (below).
    assert resumed and resumed[0]["reason"] in ("backchannel", "no words", "no words in time"), resumed
    assert "turn.interrupted" not in events
    answered = {r["turn"] for r in records if r["event"] == "llm.first_block"}
    assert len(answered) == 1, answered  # the story, not the "Okay."
