"""The real tree, reached through the workspace's root fd.

No pyfuse3 and no trio here: these modules are shared by the filesystem (``fs/``), the
capture (``capture.py``) and the restore engine (``rewind/``).

- ``walk``      ``open_parent``/``open_dir``/``DirCache``: component-by-component
                ``O_NOFOLLOW`` walks that cannot leave the workspace
- ``meta``      stat, xattrs, file keys and metadata of one entry; rewindfs' temp names
- ``ignore``    the ignore rules (paths never captured)
- ``fdbudget``  the fd budget shared by the caches
- ``syscalls``  the few libc calls Python lacks (syncfs, malloc_trim)
"""
