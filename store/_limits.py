"""The store's bounds on names and numbers a caller gives it, in one light module (no
LMDB): the control protocol and the CLI check them before a request reaches the store,
so an out-of-range value is named as the caller's option, not as a store error."""

MAX_SESSION = 256              # bytes of a session name (UTF-8)
MAX_TURN = (1 << 32) - 1       # turn numbers are 1 … MAX_TURN (a u32 in the index keys)
