"""Debian's Chromium for the browser tests, headless, driven by Playwright (never `playwright install`:
the browser comes from requirements/debian.txt). Screenshots go to `ARTIFACTS` (git-ignored)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM = Path("/usr/lib/chromium/chromium")  # the binary; /usr/bin/chromium is a wrapper script
HEADLESS_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def launch(playwright: Any, extra_flags: list[str] | None = None) -> Browser:
    """A fresh headless Chromium; a clear failure when Debian's package is missing."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} missing: `make setup` installs Debian's chromium (requirements/debian.txt)")
    browser: Browser = playwright.chromium.launch(
        executable_path=str(CHROMIUM), args=[*HEADLESS_FLAGS, *(extra_flags or [])]
    )
    return browser
