"""The C library this process already has loaded, for the system calls Python's os module lacks (mount,
umount2, unshare). dlopen(NULL) finds it without a search: ctypes.util.find_library runs `ldconfig -p`,
a process of its own (about 13 ms) at every import of a module that asked for it."""

import ctypes

libc = ctypes.CDLL(None, use_errno=True)
