"""Shared fixtures for tests that drive a real browser: Debian's chromium through Playwright's
sync API (``executable_path=/usr/bin/chromium``; never ``playwright install``), and a real web
UI server on 127.0.0.1, port 0, in a thread. A test module imports the fixtures it uses::

    from browser import browser, artifacts, open_page  # noqa: F401  (pytest fixtures)

One browser per module (a launch costs about a second); every page a test opens fails the test
if a JavaScript dialog fires (``alert`` from injected markup) or an uncaught error is thrown.
Screenshots go to ``$XPUPROF_TEST_ARTIFACTS`` when set, else to the test session's tmp dir.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
        "--no-first-run"]  # fmt: skip
ARTIFACTS_ENV = "XPUPROF_TEST_ARTIFACTS"
VIEWPORT = {"width": 1400, "height": 900}


def skip_reason() -> str | None:
    """Why browser tests cannot run here (None when they can)."""
    if not CHROMIUM.exists():
        return (f"{CHROMIUM} not found: install Debian's chromium (apt-get install chromium; "
                ".ci/run does) to run the browser tests")  # fmt: skip
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[test]')"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless chromium for the module, closed whatever happens."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory) -> Path:
    """Where screenshots go: ``$XPUPROF_TEST_ARTIFACTS`` or the session's tmp dir."""
    env = os.environ.get(ARTIFACTS_ENV)
    d = Path(env) if env else tmp_path_factory.mktemp("screenshots")
    d.mkdir(parents=True, exist_ok=True)
    return d


class Watched:
    """A page with what went wrong on it: dialogs opened (and dismissed), page errors, and
    console errors other than expected HTTP error statuses."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        page.on("dialog", self._dialog)
        page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        page.on("console", self._console)

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    def _console(self, msg: Any) -> None:
        if msg.type == "error" and "Failed to load resource" not in msg.text:
            self.errors.append(f"console: {msg.text}")

    def check(self) -> None:
        assert not self.dialogs, f"dialogs fired: {self.dialogs}"
        assert not self.errors, f"errors in the page: {self.errors}"


@contextlib.contextmanager
def open_page(browser: Any, **context: Any) -> Iterator[Watched]:
    """A new page (in its own context) that is checked for dialogs and errors and closed on
    every path."""
    ctx = browser.new_context(viewport=VIEWPORT, **context)
    try:
        watched = Watched(ctx.new_page())
        yield watched
        watched.check()
    finally:
        ctx.close()


def shot(page: Any, artifacts: Path, name: str, *, full: bool = False) -> Path:
    """Save a screenshot of the page as ``NAME.png`` under the artifacts folder."""
    path = artifacts / f"{name}.png"
    page.screenshot(path=str(path), full_page=full)
    return path
