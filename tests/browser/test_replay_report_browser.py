"""The replay report (voiceagent/replay/report.py) in real headless Chromium: it opens from the file with no
network, its waterfall pictures are drawn at a real size, trace text stays text, and the regressed stage is
highlighted. A screenshot goes to test-artifacts/replay-report.png.
"""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import expect, sync_playwright

from tests.browser.chromium import ARTIFACTS, launch
from tests.voiceagent.test_replay_report import Turn, trace_records, write_jsonl
from voiceagent.replay.analysis import summarize
from voiceagent.replay.compare import compare
from voiceagent.replay.report import TITLE, write_html
from voiceagent.replay.traces import read_trace

HOSTILE = '<img src=x onerror="window.pwned = 1"><script>window.pwned = 2</script>'


def _report(tmp_path: Path) -> Path:
    """Two runs of three turns, the second slower from the first block on, compared in one report."""

    def turns(slower: float) -> list[Turn]:
        return [
            Turn(
                v2v=v + slower,
                tts=v + slower - 40,
                first_block=v + slower - 120,
                blocks=[(v + slower - 120, 3, 4, 3), (v + slower + 80, 4, 4, 4)],
                played=[v + slower + 300, v + slower + 900],
                text=HOSTILE if v == 400 else f"question {v:.0f}",
            )
            for v in (400.0, 500.0, 650.0)
        ]

    base = summarize(read_trace(write_jsonl(tmp_path / "base.jsonl", trace_records(turns(0.0)))), "base")
    new = summarize(read_trace(write_jsonl(tmp_path / "new.jsonl", trace_records(turns(200.0)))), "new")
    path = tmp_path / "report.html"
    write_html(path, [base, new], compare(base, new))
    return path


def test_the_report_renders_offline_in_chromium(tmp_path: Path) -> None:
    path = _report(tmp_path)
    requests: list[str] = []
    console: list[str] = []
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("request", lambda request: requests.append(request.url))
            page.on("console", lambda message: console.append(f"{message.type}: {message.text}"))
            page.on("pageerror", lambda error: console.append(f"page error: {error}"))
            page.goto(path.as_uri())
            try:
                assert page.title() == TITLE
                expect(page.get_by_role("heading", name=TITLE)).to_be_visible()
                pictures = page.locator("svg.waterfall")
                expect(pictures).to_have_count(3)
                for index in range(3):
                    box = pictures.nth(index).bounding_box()
                    assert box is not None and box["width"] > 300 and box["height"] > 100, box
                # the hostile transcript is shown as text and ran nothing
                expect(page.get_by_text(HOSTILE).first).to_be_visible()
                assert page.evaluate("window.pwned") is None
                assert page.locator("img, script").count() == 0
                # the regressed stage's row stands out
                regressed = page.locator("section.comparison tr.regressed")
                expect(regressed).to_have_count(3)  # first block, TTS first audio, voice-to-voice
                expect(regressed.last).to_contain_text("voice-to-voice")
                background = regressed.first.locator("td").first.evaluate(
                    "(cell) => getComputedStyle(cell).backgroundColor"
                )
                assert background == "rgb(255, 235, 233)", background
                assert all(url.startswith("file:") for url in requests), requests  # nothing from a network
                assert not console, console
            finally:
                ARTIFACTS.mkdir(exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / "replay-report.png"), full_page=True)
        finally:
            browser.close()
