"""The voice-vs-Pipecat bench's pure parts: the speech-end reference, both systems' timelines, the report.

Neither Pipecat nor llama.cpp's server runs here (the bench runs them)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench.voice_vs_pipecat.ours import turn_times_ns
from bench.voice_vs_pipecat.pipecat_side import pipecat_run
from bench.voice_vs_pipecat.report import markdown, summarize
from bench.voice_vs_pipecat.timeline import (
    ClipRun,
    SystemRun,
    after_speech_ms,
    paired_ratios,
    ratio,
    speech_end_s,
    system_summary,
)
from tests.fakes import FakeClock
from voiceagent.trace import (
    ASR_FINAL,
    LLM_FIRST_BLOCK,
    OUT_FIRST_AUDIO,
    SESSION_START,
    TTS_FIRST_AUDIO,
    VAD_SPEECH_END,
    Trace,
)

RATE = 16000


def clip_audio(lead_s: float, speech_s: float, tail_s: float, level: int = 8000) -> np.ndarray:
    rng = np.random.default_rng(0)
    speech = (rng.uniform(-1, 1, int(speech_s * RATE)) * level).astype(np.int16)
    hiss = (rng.uniform(-1, 1, int(tail_s * RATE)) * 100).astype(np.int16)  # below -40 dBFS: not speech
    return np.concatenate([np.zeros(int(lead_s * RATE), np.int16), speech, hiss])


def test_the_speech_ends_at_the_last_loud_sample_whatever_quiet_follows() -> None:
    audio = clip_audio(1.0, 1.5, 2.0)
    assert speech_end_s(audio) == pytest.approx(2.5, abs=1 / RATE)
    assert speech_end_s(audio[: int(2.0 * RATE)]) == pytest.approx(2.0, abs=1 / RATE)  # cut mid-speech


def test_a_clip_with_nothing_said_or_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(ValueError, match="nothing was said"):
        speech_end_s(np.zeros(RATE, np.int16))
    with pytest.raises(ValueError, match="int16"):
        speech_end_s(np.zeros(RATE, np.float32))


def test_events_are_timed_from_the_speech_end_on_the_push_schedule() -> None:
    t0 = 5_000_000_000
    times = {"voice_to_voice": t0 + 3_200_000_000, "transcript": t0 + 2_600_000_000, "tts_first_audio": None}
    assert after_speech_ms(times, t0, 2.5) == {
        "voice_to_voice": 700.0,
        "transcript": 100.0,
        "tts_first_audio": None,
    }


def test_our_trace_gives_each_stage_of_the_answered_turn() -> None:
    trace = Trace(None, "s", FakeClock(start_ns=0))
    trace.write(SESSION_START, 0, t_ns=1_000_000_000)
    trace.write(VAD_SPEECH_END, 1, t_ns=3_560_000_000, confirmed_ns=3_700_000_000)
    for event, at_ms in (
        (ASR_FINAL, 3710),
        (LLM_FIRST_BLOCK, 4000),
        (LLM_FIRST_BLOCK, 4100),
        (TTS_FIRST_AUDIO, 4300),
    ):
        trace.write(event, 1, t_ns=at_ms * 1_000_000)
    trace.write(OUT_FIRST_AUDIO, 2, t_ns=9_000_000_000)  # a later turn's: not this one's
    t0, times = turn_times_ns(trace.records, 1)
    figures = after_speech_ms(times, t0, 2.5)  # the speech ended 2.5 s into the clip: at 3.5 s
    assert figures == {
        "turn_end": 200.0,
        "vad_speech_end": 60.0,
        "transcript": 210.0,
        "first_text": 500.0,
        "tts_first_audio": 800.0,
        "voice_to_voice": None,
    }


def test_a_trace_without_its_start_is_refused() -> None:
    with pytest.raises(ValueError, match="session.start"):
        turn_times_ns([{"t_ns": 1, "turn": 1, "event": VAD_SPEECH_END}], 1)


def test_pipecats_result_is_timed_from_the_same_speech_end_and_scored() -> None:
    ms = 1_000_000
    result = {
        "t0_ns": 0,
        "times_ns": {"turn_end": 3000 * ms, "transcript": 2990 * ms, "first_text": 3500 * ms,
                     "tts_first_audio": 4000 * ms, "voice_to_voice": 4010 * ms, "bot_stopped": 7000 * ms},
        "vad_stops_ns": [1500 * ms, 2750 * ms, 9000 * ms],  # a pause, the end, a later stop
        "transcript": "What is the capital of France",
        "reply": "Paris.",
        "errors": [],
    }  # fmt: skip
    run = pipecat_run(result, "What is the capital of France?", 2.5)
    assert run.latency_ms == {
        "turn_end": 500.0,
        "transcript": 490.0,
        "first_text": 1000.0,
        "tts_first_audio": 1500.0,
        "voice_to_voice": 1510.0,
        "vad_stop": 250.0,
    }
    assert run.word_error_rate == 0.0


def two_clips() -> list[ClipRun]:
    def run(v2v: float | None, wer: float) -> SystemRun:
        return SystemRun("t", "r", wer, {"voice_to_voice": v2v, "turn_end": 100.0})

    a = ClipRun(0, "piper", "q0", 2.0, "ours", {"ours": run(1000.0, 0.0), "pipecat": run(2000.0, 0.2)})
    b = ClipRun(
        1, "espeak:en-us", "q1", 2.1, "pipecat", {"ours": run(1500.0, 0.1), "pipecat": run(None, 0.0)}
    )
    return [a, b]


def test_the_summary_compares_the_systems_on_what_each_answered() -> None:
    clips = two_clips()
    ours, pipecat = system_summary(clips, "ours"), system_summary(clips, "pipecat")
    assert ours["voice_to_voice"]["p50"] == 1250.0 and ours["clips_answered"] == 2
    assert pipecat["voice_to_voice"]["n"] == 1 and pipecat["clips_answered"] == 1
    assert ours["mean_word_error_rate"] == 0.05
    assert paired_ratios(clips) == [0.5]  # only the clip both answered
    assert ratio(1000.0, 2000.0) == 0.5 and ratio(None, 2000.0) is None and ratio(1.0, 0.0) is None


def test_the_page_and_the_json_line_hold_both_systems_and_the_ratio() -> None:
    meta = {
        "date": "2026-12-01",
        "command": "python -m bench.voice_vs_pipecat --limit 2",
        "machine": {
            "cpu": "AMD EPYC",
            "cores": "2",
            "avx2": "yes",
            "avx512f": "no",
            "torch_cpu_capability": "AVX2",
        },
        "load_before": "load average: 1.0",
        "load_after": "load average: 2.0",
        "order": "interleaved",
        "ours_models": {"target": "qwen2.5-coder-1.5b-instruct", "asr": "tiny.en"},
        "pipecat_requirements": ["pipecat-ai[silero,whisper,piper,openai]==1.14.0"],
    }
    summary = summarize(two_clips(), meta)
    assert summary["ratio_ours_over_pipecat"] == {"p50": 0.625, "p95": 0.738, "paired_median": 0.5}
    json.loads(json.dumps(summary))  # one JSON object for the last stdout line
    page = markdown(summary, ["A note."])
    assert "ours 1250 / 1475 ms, Pipecat 2000 / 2000 ms" in page
    assert "AVX2 yes, AVX-512 no" in page and "load average: 2.0" in page and page.endswith("A note.\n")
    assert "| 1 | espeak:en-us | pipecat | 1500 | — |" in page
    assert "Ours: target qwen2.5-coder-1.5b-instruct, asr tiny.en. Pipecat: `pipecat-ai[" in page
