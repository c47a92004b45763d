"""A workspace nobody mounted, in the harness's web UI, in a real browser.

A person opens the web UI on a project and forgets `rewindfs mount` (or the daemon
died).  The harness works as before, and the plugin said so only on the web server's
stderr ("turn 1 … is NOT protected"), which the person in the browser never sees: they
learned it when they tried to rewind, after the damage.  The page itself now says so,
in the session header, from the first turn on, with the reason and what to run.

The same when the daemon dies under a running session (kill -9, the OOM killer): the
turn after it runs unprotected, and the controls say what brings the workspace back
(`rewindfs mount --recover`), where they said only "ECONNREFUSED".
"""

from __future__ import annotations

import contextlib
import os
import signal

import pytest

from dshkit import Dsh, MockModel, harness
from mountkit import mounted
from test_web_ui import bash, open_workspace, rewind_control, send
from webkit import Browser, WebServer, browser_driver

pytestmark = pytest.mark.e2e

NOTICE = '[data-rewindfs="unprotected"]'


TWO_TURNS = {
    "turn one": [{"tool_calls": [bash("echo one > a.txt")]}, {"content": "one done"}],
    "turn two": [{"tool_calls": [bash("echo two > b.txt")]}, {"content": "two done"}]}


@contextlib.contextmanager
def web_ui(tmp_path, capsys, title: str, mount: bool, turns=None):
    """The web UI on a fresh workspace, opened in Chromium, its scripted turns (prompt →
    steps; default: two) not yet sent: yields ``(page, mount, dsh)`` (``mount`` None
    when nobody mounts it)."""
    paths = harness()
    driver = browser_driver()
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    with contextlib.ExitStack() as stack:
        model = stack.enter_context(MockModel({"title": title, "turns": turns or TWO_TURNS}, tmp_path))
        dsh = Dsh(paths, tmp_path, model, store)
        dsh.install_plugin(cwd=tmp_path, profile="web")
        daemon = stack.enter_context(mounted(ws, store, require_clean=False)) if mount else None
        web = stack.enter_context(WebServer(dsh, ws, tmp_path))
        page = stack.enter_context(Browser(paths["NODE_BIN"], driver, tmp_path / "screenshots"))
        try:
            open_workspace(page, web, ws)
            yield page, daemon, dsh
        finally:
            with capsys.disabled():
                print(f"\nweb UI screenshots: {page.shots}")


def test_turns_that_run_unprotected_are_said_in_the_page(tmp_path, capsys):
    with web_ui(tmp_path, capsys, "forgot to mount", mount=False) as (page, _, _):
        send(page, "turn one")
        page.do("wait", target="text=one done")
        page.do("wait", target=NOTICE)
        assert page.do("text", target=NOTICE)["text"] == "⚠ rewindfs: turn 1 NOT protected"
        full = page.do("attr", target=NOTICE, name="title")["value"]
        assert full.startswith("rewindfs: turn 1 ran NOT protected (its changes "
                               "cannot be rewound): not-mounted: "), full
        assert "rewindfs mount" in full, full
        send(page, "turn two")
        page.do("wait", target="text=two done")
        page.do("wait", target=f'{NOTICE}:has-text("turns 1, 2 NOT protected")')
        page.shot("1-unprotected-notice")
        # the header's own controls are still there beside it
        page.do("wait", target='[aria-label="rewind status"]')
        # the turn's own control says why it cannot rewind
        tip = page.do("attr", target=rewind_control(2), name="title")["value"]
        assert "not-mounted" in tip, tip


def test_a_daemon_killed_under_the_session_is_said_with_the_way_back(tmp_path, capsys):
    ws = tmp_path / "ws"
    with web_ui(tmp_path, capsys, "daemon killed", mount=True) as (page, daemon, _):
        send(page, "turn one")
        page.do("wait", target="text=one done")
        assert page.do("count", target=NOTICE)["count"] == 0   # protected
        os.kill(daemon.proc.pid, signal.SIGKILL)
        daemon.proc.wait()
        send(page, "turn two")
        page.do("wait", target="text=two done")
        page.do("wait", target=f'{NOTICE}:has-text("turn 2 NOT protected")')
        full = page.do("attr", target=NOTICE, name="title")["value"]
        assert "daemon-unreachable" in full and \
            f"`rewindfs mount --recover {ws}` brings the workspace back" in full, full
        page.shot("2-daemon-killed")
