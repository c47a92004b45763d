"""The store's bounds on names and numbers a caller gives it, in one light module (no
LMDB): the control protocol and the CLI check them before a request reaches the store,
so an out-of-range value is named as the caller's option, not as a store error."""

import re

from ._errors import BadRemoteName

MAX_SESSION = 256              # bytes of a session name (UTF-8)
MAX_TURN = (1 << 32) - 1       # turn numbers are 1 … MAX_TURN (a u32 in the index keys)

_REMOTE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_remote_name(name) -> str:
    """*name* if it can name a remote (it is a key part and a word on the command line),
    else ``BadRemoteName``."""
    if not isinstance(name, str) or not _REMOTE_NAME.fullmatch(name):
        raise BadRemoteName(remote=name, reason="a remote name is 1 to 64 letters, digits, "
                            "'.', '_' or '-', starting with a letter or digit")
    return name
