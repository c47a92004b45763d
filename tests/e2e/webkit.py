"""Driving the harness's web UI in a real browser, for tests.

- :func:`browser_driver` installs the npm driver (playwright-core) with
  ``scripts/setup-browser.sh`` into ``$REWINDFS_BROWSER_PREFIX`` (default
  ``<repo>/.browser``) and finds Debian's ``chromium``; nothing is skipped: no
  browser, no pass.
- :class:`WebServer` runs ``dsh --profile web --no-open --host 127.0.0.1 --port N``
  in a directory (a context manager; stops the server it started, by pid).
- :class:`Browser` is ``browser/driver.mjs`` as a subprocess: :meth:`Browser.do`
  sends one command and returns the reply; a failed command fails the test with a
  screenshot of the moment (its path printed).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import subprocess
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]

# The web profile's session logs as plain JSONL, so a test can read titles and headers.
PLAIN_LOGS = """\
- id: session-persistence-jsonl
  config: {root: !!js dshHomePath('sessions'), compression: none, packChunks: false}
"""


def browser_driver() -> dict:
    """Install (or find) playwright-core and chromium; returns {PLAYWRIGHT_CORE, CHROMIUM}."""
    prefix = os.environ.get("REWINDFS_BROWSER_PREFIX") or str(ROOT / ".browser")
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "setup-browser.sh"), prefix],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"setup-browser.sh failed:\n{proc.stderr[-4000:]}"
    paths = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    chromium = shutil.which("chromium") or paths.get("CHROMIUM", "")
    assert os.access(chromium, os.X_OK), "no chromium: apt-get install chromium (.ci/run does)"
    paths["CHROMIUM"] = chromium
    return paths


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WebServer:
    """``dsh --profile web`` serving ``cwd`` on 127.0.0.1; ``url`` once it listens."""

    def __init__(self, dsh, cwd: pathlib.Path, workdir: pathlib.Path):
        self.dsh = dsh
        self.cwd = cwd
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.patch = workdir / "web-plain-logs.yml"
        self.patch.write_text(PLAIN_LOGS)
        self.out = open(workdir / "dsh-web.out", "w+")
        self.proc = None

    def __enter__(self):
        env = dict(self.dsh.env, REWINDFS_DSH_DEBUG="1")
        self.proc = subprocess.Popen(
            [self.dsh.paths["DSH_BIN"], "--profile", "web", "--patch", str(self.patch),
             "--no-open", "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=self.cwd, env=env, stdout=self.out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while f"dsh web: http://127.0.0.1:{self.port}" not in self.log():
            assert self.proc.poll() is None, f"dsh web exited {self.proc.returncode}:\n{self.log()[-4000:]}"
            assert time.monotonic() < deadline, f"dsh web did not listen:\n{self.log()[-4000:]}"
            time.sleep(0.1)
        return self

    def log(self) -> str:
        self.out.flush()
        return pathlib.Path(self.out.name).read_text(errors="replace")

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.out.close()


class Browser:
    """Chromium through ``browser/driver.mjs``; screenshots go to ``shots``."""

    def __init__(self, node: str, driver: dict, shots: pathlib.Path):
        shots.mkdir(parents=True, exist_ok=True)
        self.shots = shots
        self.console: list[str] = []
        self.proc = subprocess.Popen(
            [node, str(HERE / "browser" / "driver.mjs"), driver["PLAYWRIGHT_CORE"],
             driver["CHROMIUM"], str(shots)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self._send({"op": "close"})
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired, AssertionError):
            self.proc.kill()
            self.proc.wait()

    def _send(self, command: dict) -> dict:
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        while True:
            line = self.proc.stdout.readline()
            assert line, f"the browser driver died (rc={self.proc.poll()}); console:\n" + "\n".join(self.console[-30:])
            if line.startswith("RWB "):
                return json.loads(line[4:])
            self.console.append(line.rstrip("\n"))

    def do(self, op: str, **params) -> dict:
        """Run one driver command; a failure fails the test, with a screenshot."""
        reply = self._send({"op": op, **params})
        if not reply.get("ok"):
            shot = self._send({"op": "screenshot", "name": f"failed-{op}-{int(time.time() * 1000)}"})
            print(f"browser: {op} {params} failed; screenshot {shot.get('path')}")
            raise AssertionError(f"browser {op} {params}: {reply.get('error')}\nconsole:\n"
                                 + "\n".join(self.console[-30:]))
        return reply

    def try_do(self, op: str, **params) -> dict:
        """Like :meth:`do`, but a failure is returned, not raised."""
        return self._send({"op": op, **params})

    def shot(self, name: str) -> str:
        path = self.do("screenshot", name=name)["path"]
        print(f"screenshot: {path}")
        return path
