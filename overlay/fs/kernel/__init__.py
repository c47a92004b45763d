"""The kernel-direct FUSE session: ``/dev/fuse`` spoken by us, no libfuse.

- ``wire``      opcodes, flags and struct layouts of the protocol (fuse.h)
- ``mounting``  ``mount(2)`` as root, ``fusermount3`` fd passing as a user; detach
- ``session``   ``KernelSession``: INIT negotiation, the trio request loop, replies,
                cache notifications, unmount
- ``dispatch``  each request → a call of the same handlers as the libfuse session,
                with pyfuse3's types
- ``backing``   passthrough backing ids, one per open inode
- ``uring``     FUSE over io_uring, the opt-in transport (``REWINDFS_URING=1``)
"""
