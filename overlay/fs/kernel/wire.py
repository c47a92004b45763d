"""The FUSE wire protocol as this session speaks it: opcodes, flags and structs.

Facts from the kernel's ``include/uapi/linux/fuse.h`` (protocol 7.x; we answer with
minor ``MINOR``, or the kernel's if that is older).  Every struct is little-endian
native layout (``<``), padded by the kernel to 8 bytes; the names follow fuse.h.
"""

from __future__ import annotations

import struct

MAJOR = 7
MINOR = 45
ROOT_ID = 1

# -- opcodes ---------------------------------------------------------------------------
LOOKUP, FORGET, GETATTR, SETATTR, READLINK, SYMLINK = 1, 2, 3, 4, 5, 6
MKNOD, MKDIR, UNLINK, RMDIR, RENAME, LINK, OPEN, READ, WRITE = 8, 9, 10, 11, 12, 13, 14, 15, 16
STATFS, RELEASE, FSYNC, SETXATTR, GETXATTR, LISTXATTR, REMOVEXATTR = 17, 18, 20, 21, 22, 23, 24
FLUSH, INIT, OPENDIR, READDIR, RELEASEDIR, FSYNCDIR = 25, 26, 27, 28, 29, 30
GETLK, SETLK, SETLKW, ACCESS, CREATE, INTERRUPT, BMAP, DESTROY = 31, 32, 33, 34, 35, 36, 37, 38
IOCTL, POLL, NOTIFY_REPLY, BATCH_FORGET, FALLOCATE, READDIRPLUS = 39, 40, 41, 42, 43, 44
RENAME2, LSEEK, COPY_FILE_RANGE, SYNCFS, TMPFILE, STATX = 45, 46, 47, 50, 51, 52
COPY_FILE_RANGE_64 = 53

# opcode → its name (request counts, logs)
OPCODE_NAMES = {
    LOOKUP: "lookup",
    FORGET: "forget",
    GETATTR: "getattr",
    SETATTR: "setattr",
    READLINK: "readlink",
    SYMLINK: "symlink",
    MKNOD: "mknod",
    MKDIR: "mkdir",
    UNLINK: "unlink",
    RMDIR: "rmdir",
    RENAME: "rename",
    LINK: "link",
    OPEN: "open",
    READ: "read",
    WRITE: "write",
    STATFS: "statfs",
    RELEASE: "release",
    FSYNC: "fsync",
    SETXATTR: "setxattr",
    GETXATTR: "getxattr",
    LISTXATTR: "listxattr",
    REMOVEXATTR: "removexattr",
    FLUSH: "flush",
    INIT: "init",
    OPENDIR: "opendir",
    READDIR: "readdir",
    RELEASEDIR: "releasedir",
    FSYNCDIR: "fsyncdir",
    GETLK: "getlk",
    SETLK: "setlk",
    SETLKW: "setlkw",
    ACCESS: "access",
    CREATE: "create",
    INTERRUPT: "interrupt",
    BMAP: "bmap",
    DESTROY: "destroy",
    IOCTL: "ioctl",
    POLL: "poll",
    NOTIFY_REPLY: "notify_reply",
    BATCH_FORGET: "batch_forget",
    FALLOCATE: "fallocate",
    READDIRPLUS: "readdirplus",
    RENAME2: "rename2",
    LSEEK: "lseek",
    COPY_FILE_RANGE: "copy_file_range",
    SYNCFS: "syncfs",
    TMPFILE: "tmpfile",
    STATX: "statx",
    COPY_FILE_RANGE_64: "copy_file_range_64",
}

# -- INIT flags (bits 32.. travel in flags2) --------------------------------------------
ASYNC_READ = 1 << 0
ATOMIC_O_TRUNC = 1 << 3
BIG_WRITES = 1 << 5
AUTO_INVAL_DATA = 1 << 12
DO_READDIRPLUS = 1 << 13
READDIRPLUS_AUTO = 1 << 14
ASYNC_DIO = 1 << 15
WRITEBACK_CACHE = 1 << 16
PARALLEL_DIROPS = 1 << 18
MAX_PAGES = 1 << 22
NO_OPENDIR_SUPPORT = 1 << 24
HANDLE_KILLPRIV_V2 = 1 << 28
INIT_EXT = 1 << 30
DIRECT_IO_ALLOW_MMAP = 1 << 36
PASSTHROUGH = 1 << 37
OVER_IO_URING = 1 << 41           # flags2 bit 9 (fuse.h FUSE_OVER_IO_URING, 7.42)

# -- other flags -------------------------------------------------------------------------
FATTR_MODE, FATTR_UID, FATTR_GID, FATTR_SIZE = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FATTR_ATIME, FATTR_MTIME, FATTR_FH = 1 << 4, 1 << 5, 1 << 6
FATTR_ATIME_NOW, FATTR_MTIME_NOW, FATTR_CTIME = 1 << 7, 1 << 8, 1 << 10
FATTR_KILL_SUIDGID = 1 << 11
FOPEN_DIRECT_IO, FOPEN_KEEP_CACHE, FOPEN_NONSEEKABLE = 1 << 0, 1 << 1, 1 << 2
FOPEN_CACHE_DIR, FOPEN_PASSTHROUGH = 1 << 3, 1 << 7
WRITE_KILL_SUIDGID = 1 << 2
OPEN_KILL_SUIDGID = 1 << 0
FSYNC_FDATASYNC = 1 << 0
NOTIFY_INVAL_INODE, NOTIFY_INVAL_ENTRY = 2, 3

# FUSE_DEV_IOC_BACKING_OPEN = _IOW(229, 1, struct fuse_backing_map (16 bytes)),
# FUSE_DEV_IOC_BACKING_CLOSE = _IOW(229, 2, uint32_t): dir=1 (write) << 30.
DEV_IOC_BACKING_OPEN = (1 << 30) | (16 << 16) | (229 << 8) | 1
DEV_IOC_BACKING_CLOSE = (1 << 30) | (4 << 16) | (229 << 8) | 2

# -- structs -----------------------------------------------------------------------------
IN_HEADER = struct.Struct("<IIQQIIIHH")          # len opcode unique nodeid uid gid pid extlen pad
OUT_HEADER = struct.Struct("<IiQ")               # len error unique
INIT_IN = struct.Struct("<IIIII")                # major minor max_readahead flags flags2
INIT_OUT = struct.Struct("<IIIIHHIIHHIIH22x")     # 64 bytes
ATTR = "QQQqqqIIIIIIIIII"                         # fuse_attr (times signed)
ENTRY_OUT = struct.Struct("<QQQQII" + ATTR)       # 128 bytes
ATTR_OUT = struct.Struct("<QII" + ATTR)           # 104 bytes
DIRENT = struct.Struct("<QQII")                   # ino off namelen type
OPEN_OUT = struct.Struct("<QIi")                  # fh open_flags backing_id
FORGET_ONE = struct.Struct("<QQ")
U32_PAIR = struct.Struct("<II")
U64 = struct.Struct("<Q")
GETATTR_IN = struct.Struct("<IIQ")                # flags dummy fh
SETATTR_IN = struct.Struct("<IIQQQqqqIIIIIIII")   # 88 bytes
MKNOD_IN = struct.Struct("<IIII")                 # mode rdev umask padding
RENAME2_IN = struct.Struct("<QII")                # newdir flags padding
CREATE_IN = struct.Struct("<IIII")                # flags mode umask open_flags
RW_IN = struct.Struct("<QQIIQII")                 # read_in / write_in (40 bytes)
RELEASE_IN = struct.Struct("<QIIQ")               # fh flags release_flags lock_owner
FSYNC_IN = struct.Struct("<QII")
FALLOCATE_IN = struct.Struct("<QQQII")            # fh offset length mode padding
COPY_RANGE_IN = struct.Struct("<QQQQQQQ")         # fh_in off_in nodeid_out fh_out off_out len flags
STATFS_OUT = struct.Struct("<QQQQQIIII24x")       # 80 bytes
INVAL_INODE = struct.Struct("<Qqq")
INVAL_ENTRY = struct.Struct("<QII")
BACKING_MAP = struct.Struct("<iIQ")
IOCTL_OUT = struct.Struct("<iIII")
