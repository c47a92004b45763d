"""What Ctrl-C means for a command that changes a tree in this process or in a daemon:
``Landing`` (rewind, redo, gc, restore).  Its own module so that every command module
can use it without importing another command's (``cli.mount`` imports ``cli.remote``,
which needs this; ``cli.rewind`` imports ``cli.mount``)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading

from rewindfs.overlay.errors import Interrupted

__all__ = ["Landing"]


class Landing:
    """What Ctrl-C means for a rewind, redo, gc or restore run by this process.

    Mounted, the daemon runs it: Ctrl-C stops only this client, ``interrupted`` names
    that.  Offline, this process lands it: until its first change (``rewind.planned``
    not yet seen) Ctrl-C stops it with nothing changed; from then on (and while an
    interrupted rewind is finished first, ``landing()``) SIGINT is deferred: one line
    says the rewind finishes first, and ``pressed`` records it for the last line.  A
    harder stop (SIGQUIT, SIGKILL) leaves the intent, which the next ``mount``,
    ``rewind`` or ``redo`` finishes.  SIGINT's own handler is put back on exit.
    """

    def __init__(self, method: str, *, dry_run: bool):
        self.method, self.dry_run = method, dry_run
        self.pressed = self.seen_event = False
        self._landing = False
        self._old = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # else: cannot, and
            self._old = signal.signal(signal.SIGINT, self._on_sigint)   # no SIGINT here
        return self

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)

    @contextlib.contextmanager
    def landing(self):
        self._landing = True
        try:
            yield
        finally:
            self._landing = False

    def watch(self, on_event, *, lands_here: bool):
        def event(ev: dict) -> None:
            self.seen_event = True
            if lands_here and ev.get("type") == "rewind.planned" and not ev.get("dry_run"):
                self._landing = True     # offline: the next step is its first change
            on_event(ev)
        return event

    def _on_sigint(self, signum, frame) -> None:
        if not self._landing:
            raise KeyboardInterrupt
        if not self.pressed:
            self.pressed = True
            try:    # a plain write: the handler may run in the middle of a rich print
                os.write(2, f"\nCtrl-C: finishing the {self.method} first (it cannot "
                            "stop half-way)\n".encode())
            except OSError:
                pass    # nowhere to say it; the last line still will

    def interrupted(self, *, mounted: bool) -> Interrupted:
        what = self.method
        if self.dry_run:
            return Interrupted("interrupted: a dry run; nothing was changed")
        if not mounted:         # raised only before the landing began
            return Interrupted(f"interrupted: the {what} stopped before its first "
                               "change; nothing was changed")
        if self.seen_event:
            return Interrupted(f"interrupted: the {what} goes on in the daemon; "
                               "`rewindfs status` shows it")
        return Interrupted(f"interrupted before the daemon answered: the {what} goes on "
                           "in the daemon if it was accepted; `rewindfs status` shows it")
