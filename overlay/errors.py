"""Every overlay error class, in one place.

The root and its contract live in the store's error module (``rewindfs.store._errors``):
each class has a ``code`` (kebab-case, sent on the control socket and matched by
scripts), an ``exit_code`` (the CLI's: 1 partial, 2 could not run, 3 usage), an
``errno`` (what a FUSE handler answers) and a docstring whose first line is the message
template.  Errors become errnos only at the FUSE boundary (``fs/ops.py``) and exit codes
only in the CLI's ``main()`` (``cli/__init__.py``).  docs/errors.md lists them all; a
test fails when it and these classes disagree.
"""

from __future__ import annotations

from rewindfs.store._errors import EXIT_COULD_NOT_RUN, EXIT_PARTIAL, EXIT_USAGE, RewindfsError


# -- workspaces, mounts and the runtime directory -----------------------------


class BadWorkspace(RewindfsError):
    """{path} is not a directory ({reason})."""

    code = "bad-workspace"


class RefusedWorkspace(RewindfsError):
    """Refusing to serve {path}: {reason}."""

    code = "refused-workspace"


class AlreadyMounted(RewindfsError):
    """{path} is already mounted (rewindfs status shows the daemon); unmount it first."""

    code = "already-mounted"


class StaleMount(RewindfsError):
    """{path} is a stale mount left by a dead daemon (transport endpoint not connected); run `rewindfs mount --recover {path}` to detach it and mount again."""

    code = "stale-mount"


class OtherStoreMount(RewindfsError):
    """{path} is served by a live rewindfs daemon, but not for the store {store}: it serves another store (name that one with --store or $REWINDFS_HOME), or its control socket was removed."""

    code = "other-store-mount"


class WorkspaceMoved(RewindfsError):
    """{path} is the workspace {was}, moved while mounted: its daemon and its history still know it by that path. `rewindfs unmount {path}` stops it cleanly; move it back and mount it there to go on with that history (mounted where it is now, it starts a new one)."""

    code = "workspace-moved"


class NotMounted(RewindfsError):
    """{path} is not served by a rewindfs daemon."""

    code = "not-mounted"


class MountFailed(RewindfsError):
    """Mounting {path} failed: {reason}."""

    code = "mount-failed"


class UnmountFailed(RewindfsError):
    """Unmounting {path} failed: {reason}."""

    code = "unmount-failed"


class MutationRunning(RewindfsError):
    """{path} was not unmounted: a {what} is under way in its daemon, and it cannot stop half-way. Unmount when it has finished (`rewindfs status` shows it), or detach anyway with `rewindfs unmount --lazy` (the {what} still finishes first)."""

    code = "rewind-running"


class DaemonStopping(RewindfsError):
    """The daemon of {path} is stopping (an unmount or a stop signal); nothing was done."""

    code = "daemon-stopping"


class UnsafeRuntimeDir(RewindfsError):
    """Refusing the runtime directory {path}: {reason}. Remove it (or set XDG_RUNTIME_DIR to a private directory) and try again."""

    code = "unsafe-runtime-dir"


class UnsafeSocket(RewindfsError):
    """Refusing the control socket {path}: {reason}; nothing was sent."""

    code = "unsafe-socket"


class UsageError(RewindfsError):
    """{message}

    The command line does not parse: an unknown option, a missing argument.
    """

    code = "usage"
    exit_code = EXIT_USAGE


# -- ignore rules -------------------------------------------------------------


class BadIgnoreRules(RewindfsError):
    """`.rewindignore` line {line}: invalid pattern `{pattern}`; {outcome}.

    Raised where the rules are loaded with no earlier rules to fall back on: the mount
    (refused) and the restore engine on an unmounted workspace (nothing changed).  A
    mounted workspace keeps its previous rules instead and reports the same line
    (``kept_previous``) in ``status`` and ``turn.begin``.
    """

    code = "bad-ignore-rules"

    def __init__(self, message=None, *, line=0, pattern="",
                 outcome="fix that line and try again; nothing was changed", **details):
        if len(pattern) > 80:    # a 1 MiB line is named, not printed
            pattern = pattern[:79] + "…"
        super().__init__(message, line=line, pattern=pattern, outcome=outcome, **details)

    def kept_previous(self) -> str:
        """The message for a daemon that keeps the rules it had."""
        return type(self)(line=self.details["line"], pattern=self.details["pattern"],
                          outcome="the previous rules are in force").message

class TooManyIgnoreRules(BadIgnoreRules):
    """`.rewindignore` has {count} patterns, more than rewindfs matches at once (at most 1,500); {outcome}.

    The rules are matched with RE2, whose compiled set has a memory bound; a file past
    it is refused as an invalid one is (``BadIgnoreRules``: the mount refuses it, a
    mounted workspace keeps its previous rules)."""

    code = "too-many-ignore-rules"

    def __init__(self, message=None, *, count=0,
                 outcome="keep the patterns that matter and try again; nothing was changed",
                 **details):
        RewindfsError.__init__(self, message, count=count, outcome=outcome, **details)

    def kept_previous(self) -> str:
        return type(self)(count=self.details["count"],
                          outcome="the previous rules are in force").message


class ForeignMount(RewindfsError):
    """{path} is served by a rewindfs daemon of uid {uid}; only that user or root can control it."""

    code = "foreign-mount"


class MountBusy(RewindfsError):
    """{path} is in use by {holders}; nothing was unmounted. Let them leave (cd out, close the files) and try again, or detach anyway with `rewindfs unmount --lazy {path}`."""

    code = "mount-busy"


# -- the control protocol -----------------------------------------------------


class ProtocolError(RewindfsError):
    """{message}

    The control protocol refused a request, or a client got an unusable reply.
    """

    code = "protocol-error"
    request_id = None   # the request's id, when it could be read (echoed in the reply)


class BadJson(ProtocolError):
    """The request is not a JSON object: {reason}."""

    code = "bad-json"


class BadVersion(ProtocolError):
    """Protocol version {got!r} is not supported (this daemon speaks v1)."""

    code = "bad-version"


class UnknownMethod(ProtocolError):
    """Unknown method {method!r}."""

    code = "unknown-method"
    exit_code = EXIT_USAGE


class BadParams(ProtocolError):
    """Bad parameters for {method}: {reason}."""

    code = "bad-params"
    exit_code = EXIT_USAGE


class TooLarge(ProtocolError):
    """The request line is longer than 1 MiB."""

    code = "too-large"


class Forbidden(ProtocolError):
    """Peer uid {uid} may not use this daemon (same uid or root only)."""

    code = "forbidden"


class FdExhausted(ProtocolError):
    """The daemon is out of file descriptors (EMFILE); request refused, try again."""

    code = "fd-exhausted"


class DaemonGone(ProtocolError):
    """The daemon closed the connection before answering."""

    code = "daemon-gone"


class DaemonDied(RewindfsError):
    """The daemon serving {path} died during the {method}: {state}; `rewindfs mount --recover {path}` {then}."""

    code = "daemon-died"


class BadReply(ProtocolError):
    """Bad reply from the daemon: {reason}."""

    code = "bad-response"


# -- the control protocol: rewind methods -------------------------------------


class ContentTooLarge(RewindfsError):
    """{path} has {size} bytes; more than 512 KiB is sent only as a stream (pass "stream": true)."""

    code = "content-too-large"


# -- remotes: pushing from the daemon ------------------------------------------


class RemoteUnnamed(RewindfsError):
    """Name the remote: {reason}."""

    code = "remote-unnamed"
    exit_code = EXIT_USAGE


class PushStopped(RewindfsError):
    """The push to {remote} stopped: {reason}; what is not pushed stays in the local store (`rewindfs push` sends it)."""

    code = "push-stopped"


# -- turn marks -----------------------------------------------------------------


class MarkRefused(RewindfsError):
    """No turn mark: {path} is open for writing and its content at the mark could not be kept ({reason}); nothing changed."""

    code = "mark-refused"
    exit_code = EXIT_COULD_NOT_RUN


# -- the restore engine -------------------------------------------------------


class NotEmpty(RewindfsError):
    """{path} must go but holds entries that were never observed; left as it is."""

    code = "not-empty"
    exit_code = EXIT_PARTIAL


class Busy(RewindfsError):
    """{path} is open for writing through the mount; left as it is (close it and rewind again)."""

    code = "busy"
    exit_code = EXIT_PARTIAL


class KindChanged(RewindfsError):
    """{path} changed kind while it was being restored; left as it is."""

    code = "raced"
    exit_code = EXIT_PARTIAL


# -- diff and show ------------------------------------------------------------


class NotAFile(RewindfsError):
    """{path} is {what} at point {point}; only files and symlinks have content."""

    code = "not-a-file"
    exit_code = EXIT_COULD_NOT_RUN


# -- the CLI ------------------------------------------------------------------

class SentThenInterrupted(KeyboardInterrupt):
    """Ctrl-C after the whole request reached the daemon's socket: the daemon carries
    it out without its client (it reads a request to the end and never cancels one
    whose client left).  Before that, a Ctrl-C is a plain ``KeyboardInterrupt`` and the
    daemon got nothing it would act on (a line cut short is never dispatched)."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with the line that says what it left behind (the rewind goes on in the
    daemon, was finished first, or nothing was changed).

    Not a ``RewindfsError``: no code, no exit code of the 0–3 contract; ``main()``
    prints ``message`` as the command's last line and exits 130, as for any Ctrl-C.
    """

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message



class NotAWorkspace(RewindfsError):
    """{path} is not a rewindfs workspace (no history in store {store}); mount it first."""

    code = "not-a-workspace"


class Absent(RewindfsError):
    """{path} did not exist at point {point}."""

    code = "absent"


class BadAmount(RewindfsError):
    """Cannot read {value!r} as {what}."""

    code = "bad-amount"
    exit_code = EXIT_USAGE

