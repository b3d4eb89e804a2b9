"""The browser demo in real headless Chromium, against `voiceagent serve` on the bundled small models.

Chromium's fake microphone plays a question synthesised by espeak-ng; the page must connect (over WebRTC,
or over the WebSocket when forced with ?transport=ws), show the transcript and the agent's reply in
committed blocks, receive audible reply audio, and show the turn's latencies. One server (SmolLM2 as target
and draft, Whisper tiny.en, Piper) serves every test of the module. Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page, expect, sync_playwright

from tests.browser.chromium import ARTIFACTS, launch
from tests.fakes import espeak_speech
from tests.support.servers import free_port, stop_process, wait_until_healthy
from voiceagent.audio import SAMPLE_RATE, write_wav
from voiceagent.wer import normalized_words, word_error_rate

pytestmark = pytest.mark.bundled

REPO = Path(__file__).resolve().parents[2]
SMOL = "smollm2-135m-instruct"
QUESTION = "What is the capital of France?"
API_KEY = "browser-test-key"  # the server requires it; the page passes ?token= on
WAIT_MS = 60_000
MEDIA_FLAGS = [
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
    "--allow-loopback-in-peer-connection",  # ICE over 127.0.0.1 (the server offers it)
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`voiceagent serve` on a free loopback port, on the small bundled models; its URL."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {
        **os.environ,
        "VOICEAGENT_LLM": "local",
        "VOICEAGENT_TARGET": SMOL,
        "VOICEAGENT_DRAFT": SMOL,
        "VOICEAGENT_DRAFT_QUANT": "none",
        # SmolLM2 drafting for itself never pays, so "auto" would not draft: a fixed length shows drafting
        "VOICEAGENT_GAMMA": "4",
        "VOICEAGENT_API_KEY": API_KEY,
    }
    command = [sys.executable, "-m", "voiceagent", "serve", "--host", "127.0.0.1", "--port", str(port)]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process, log_path, timeout_s=180.0, path="/healthz")
        yield url
    finally:
        stop_process(process)


@pytest.fixture(scope="module")
def question_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The question as a 16-bit PCM WAV, with 2 s of silence first: Chromium's fake microphone starts
    playing at getUserMedia, before the connection is up."""
    directory = tmp_path_factory.mktemp("speech")
    speech = espeak_speech(QUESTION, directory)
    silence = np.zeros(2 * SAMPLE_RATE, dtype=np.int16)
    path = directory / "question.wav"
    write_wav(path, np.concatenate([silence, speech, silence]), SAMPLE_RATE)
    return path


@contextlib.contextmanager
def browser_page(microphone: Path, viewport: dict[str, int]) -> Iterator[tuple[Page, list[str]]]:
    """A page in a fresh headless Chromium whose microphone plays `microphone` once; the page's console
    lines are collected for failure messages."""
    args = [*MEDIA_FLAGS, f"--use-file-for-fake-audio-capture={microphone}%noloop"]
    console: list[str] = []
    with sync_playwright() as playwright:
        browser = launch(playwright, args)
        try:
            page = browser.new_page(viewport=viewport)
            page.on("console", lambda message: console.append(f"{message.type}: {message.text}"))
            page.on("pageerror", lambda error: console.append(f"page error: {error}"))
            yield page, console
        finally:
            browser.close()


def _events(page: Page, kind: str) -> list[dict[str, object]]:
    return list(page.evaluate("(kind) => window.voiceagent.events.filter((e) => e.type === kind)", kind))


def _voiced_ms(page: Page) -> int:
    return int(page.evaluate("async () => (await window.voiceagent.receivedAudio()).voicedMs"))


def converse(page: Page, url: str) -> None:
    """Start, hear the question out, and check everything the page must show for one turn."""
    page.goto(url)
    page.get_by_role("button", name="Start").click()
    expect(page.get_by_test_id("transcript")).to_contain_text(re.compile("capital", re.I), timeout=WAIT_MS)
    page.wait_for_function(
        "() => window.voiceagent.events.some((e) => e.type === 'turn.metrics')", timeout=WAIT_MS
    )
    finals = [str(e["text"]) for e in _events(page, "transcript.final") if e["text"]]
    # The question was heard, give or take one word in five: tiny.en hears this espeak-ng voice's "of
    # France" as "and France" or "of friends" now and then, also offline in one pass over the whole audio.
    # It also says a short question twice at times: the words the question has are compared.
    heard = " ".join(normalized_words(finals[0])[: len(normalized_words(QUESTION))]) if finals else ""
    assert word_error_rate(QUESTION, heard) <= 0.2, finals
    reply = page.get_by_test_id("agent").inner_text().strip()
    assert re.search(r"[A-Za-z]{2,}", reply), reply
    blocks = _events(page, "agent.block")
    assert "".join(str(b["text"]) for b in blocks).strip() == reply
    # Committed blocks are drawn with their drafted/accepted counts, and the running figures are shown.
    drawn = page.locator("[data-testid=agent] .block")
    assert drawn.count() == len(blocks)
    assert sum(int(b["n_drafted"] or 0) for b in blocks) > 0  # the draft model was used
    expect(page.get_by_test_id("acceptance")).to_contain_text("%")
    expect(page.get_by_test_id("ms-per-token")).to_contain_text("ms")
    expect(page.locator("[data-testid=waterfall] li")).to_have_count(1)
    # The reply's audio arrived and was audible (not just silence frames).
    deadline = time.monotonic() + 20
    while _voiced_ms(page) < 300 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _voiced_ms(page) >= 300, "no audible reply audio reached the page"


@pytest.mark.parametrize(
    ("query", "transport", "viewport"),
    [
        (f"?token={API_KEY}", "WebRTC", {"width": 1280, "height": 800}),
        (f"?transport=ws&token={API_KEY}", "WebSocket", {"width": 390, "height": 844}),  # a phone
    ],
    ids=["webrtc", "websocket-phone"],
)
def test_a_spoken_question_is_transcribed_answered_and_heard(
    server: str, question_wav: Path, query: str, transport: str, viewport: dict[str, int]
) -> None:
    with browser_page(question_wav, viewport) as (page, console):
        try:
            converse(page, f"{server}/{query}")
            assert page.evaluate("window.voiceagent.transport") == transport
        except (AssertionError, PlaywrightError) as error:
            raise AssertionError(f"{error}\npage console:\n" + "\n".join(console[-30:])) from None
        finally:
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / f"browser-demo-{transport.lower()}.png"), full_page=True)
        page.get_by_role("button", name="Stop").click()
        expect(page.get_by_role("button", name="Start")).to_be_enabled()
    # Stopping ended the session on the server: its slot is free again.
    deadline = time.monotonic() + 10
    while httpx.get(f"{server}/healthz").json()["sessions"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert httpx.get(f"{server}/healthz").json()["sessions"] == 0


def test_a_missing_token_is_reported_on_the_page(server: str, question_wav: Path) -> None:
    with browser_page(question_wav, {"width": 1280, "height": 800}) as (page, _):
        page.goto(f"{server}/")
        page.get_by_role("button", name="Start").click()
        expect(page.locator("#error")).to_contain_text("API key", timeout=15_000)
        expect(page.get_by_role("button", name="Start")).to_be_enabled()
        assert page.evaluate("window.voiceagent.transport") is None


def test_without_webrtc_the_page_falls_back_to_the_websocket(server: str, question_wav: Path) -> None:
    with browser_page(question_wav, {"width": 1280, "height": 800}) as (page, console):
        page.add_init_script("delete window.RTCPeerConnection")  # a browser or webview without WebRTC
        page.goto(f"{server}/?token={API_KEY}")
        page.get_by_role("button", name="Start").click()
        page.wait_for_function(
            "() => window.voiceagent.events.some((e) => e.type === 'session.started')", timeout=WAIT_MS
        )
        assert page.evaluate("window.voiceagent.transport") == "WebSocket"
        assert any("WebRTC" in line and "failed" in line for line in console), console
        expect(page.locator("#status")).to_contain_text("WebSocket")
        page.get_by_role("button", name="Stop").click()
