"""The control socket, server side (and the thin client the CLI uses).

- ``wire``            the wire format: framing, request parsing, ONE set of param
                      readers, replies, error codes on the wire
- ``host``            typed seams: what the methods need from the daemon or the CLI
- ``client``          the blocking client the CLI uses (``call``)
- ``methods``         the method table and ``dispatch``: turn marks, status, points, fork
- ``rewind_methods``  rewind, redo, diff, show and gc (run in a worker thread)
- ``remote_methods``  ``push`` (now, streamed, or queued)
- ``autopush``        the background pushers of ``mount --auto`` and ``push``
- ``server``          the listening socket: bind 0600, peer uid, line framing, overload
- ``handoff``         batches items from a worker thread to the trio thread
"""
