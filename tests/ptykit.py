"""A command in a real terminal, for tests where the terminal matters (Ctrl-C).

``Terminal(argv, cwd=…, env=…)`` runs *argv* on a fresh pty (``os.forkpty``: the child
is a session leader whose controlling terminal is the pty, so it is the foreground
process group), 100×24.  ``ctrl_c()`` writes ``\\x03`` to the master side: the terminal
driver turns it into SIGINT for the foreground group, exactly as a person's keyboard
does — no ``kill`` from the test.  Output is read continuously by a thread (a full pty
would block the child).  ``wait()`` returns the exit code (negative: killed by that
signal); ``lines()`` the output with escape sequences removed and carriage-return
redraws (progress bars) resolved, ``last_line()`` its last non-empty line.

Every ``Terminal`` is ended by ``close()`` (or ``with``): a child still running then is
SIGKILLed by its pid and reaped.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import struct
import termios
import threading
import time

__all__ = ["Terminal"]

_ESC = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]|\x1b[=>78]")
_WAIT_S = 120.0


class Terminal:
    def __init__(self, argv, *, cwd, env=None):
        self._buf = bytearray()
        self._lock = threading.Lock()
        self.status = None
        pid, fd = os.forkpty()
        if pid == 0:        # the child: exec, never return into pytest
            try:
                os.chdir(cwd)
                os.execve(argv[0], list(argv), dict(os.environ, **(env or {})))
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError:         # EIO: every slave side closed (the child ended)
                return
            if not data:
                return
            with self._lock:
                self._buf += data

    def text(self) -> str:
        with self._lock:
            raw = bytes(self._buf)
        return _ESC.sub(b"", raw).decode("utf-8", "replace")

    def wait_for(self, needle: str, timeout: float = _WAIT_S) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.text():
            if time.monotonic() > deadline or self._exited():
                if needle in self.text():
                    return
                raise AssertionError(f"{needle!r} never appeared:\n{self.text()[-3000:]}")
            time.sleep(0.01)

    def wait_for_file(self, path, timeout: float = 120.0) -> None:
        """Until *path* exists (a test hook's pause file), while the program runs."""
        deadline = time.monotonic() + timeout
        while not os.path.exists(path):
            if time.monotonic() > deadline or self._exited():
                raise AssertionError(f"{path} never appeared:\n{self.text()[-3000:]}")
            time.sleep(0.01)

    def ctrl_c_in_pause(self, pause, says: str) -> int:
        """Ctrl-C while the program waits in the pause hook (``REWINDFS_PAUSE_FILE`` =
        *pause*); once it *says* so, let it go on; its exit status."""
        self.wait_for_file(pause)
        self.ctrl_c()
        self.wait_for(says)
        os.unlink(pause)
        return self.wait()

    def ctrl_c(self) -> None:
        os.write(self.fd, b"\x03")

    def _exited(self) -> bool:
        if self.status is None:
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(st)
        return self.status is not None

    def wait(self, timeout: float = _WAIT_S) -> int:
        deadline = time.monotonic() + timeout
        while not self._exited():
            if time.monotonic() > deadline:
                raise AssertionError(f"still running after {timeout}s:\n{self.text()[-3000:]}")
            time.sleep(0.01)
        self._reader.join(10)       # the rest of its output
        return self.status

    def lines(self) -> list[str]:
        out = []
        for line in self.text().replace("\r\n", "\n").split("\n"):
            out.append(line.rsplit("\r", 1)[-1].rstrip())   # what a redraw left visible
        return out

    def last_line(self) -> str:
        shown = [line for line in self.lines() if line.strip()]
        return shown[-1] if shown else ""

    def close(self) -> None:
        if not self._exited():
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.status = -signal.SIGKILL
        try:
            os.close(self.fd)
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
