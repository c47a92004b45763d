"""The FUSE filesystem: how kernel requests reach the real tree.

- ``ops``       ``RewindOperations``: thin pyfuse3 handlers, the errno boundary, and the
                write-ahead guard (captured set, ``EpochClosed`` retry, write and rewind
                fences)
- ``inodes``    the inode table (FUSE inode ↔ real file, cached fds)
- ``notify``    kernel cache invalidation, queued off the request path
- ``latewrites`` writes by processes of turns a rewind removed (reported, not refused)
- ``session``   the one seam between the kernel session and the handlers (today
                pyfuse3's session and request loop); a second session layer plugs in here
"""

# The session layers ``session.choose`` knows, here so that the CLI can offer them
# without loading either.
SESSIONS = ("libfuse", "kernel")
