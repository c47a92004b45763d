"""The restore engine: rewind, redo and diff of a workspace against the store.

- ``engine``    plan (``plan_rewind``/``plan_redo``), apply (write-ahead intent, landing
                order, fences) and ``recover`` after a crash
- ``land``      landing one entry: staged temp files, renames, links, deletes
- ``links``     the inode index that finds every name of a hard-linked file
- ``adopt``     adopting entries that already match a pre-image (no rewrite)
- ``diff``      what changed between two points, and a point's content of one path
"""
