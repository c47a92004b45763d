"""rewindfs, harness side: the control-socket client and the agent-loop API.

``plugin`` talks to the daemon only through its control socket; it never imports
``store`` or ``overlay`` and never opens the LMDB store.  ``plugin/dsh/`` is the npm
package for the DeepSeek Harness (plain JavaScript, not imported from Python).
"""

from ._errors import (BadResponse, ConnectionLost, DaemonUnreachable, NotMounted,
                      RewindfsClientError, Timeout)
from ._paths import control_socket_path, default_store_path, find_socket
from ._results import Change, Failure, Point, RewindResult, Status
from .agent import Rewindfs, TurnMark, UnknownTurn
from .client import Client, TrioClient

__all__ = [
    "BadResponse", "Change", "Client", "ConnectionLost", "DaemonUnreachable", "Failure",
    "NotMounted", "Point", "RewindResult", "Rewindfs", "RewindfsClientError", "Status",
    "Timeout", "TrioClient", "TurnMark", "UnknownTurn", "control_socket_path",
    "default_store_path", "find_socket",
]
