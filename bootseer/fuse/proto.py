"""The FUSE kernel protocol, as much of it as a read-only server needs (``linux/fuse.h``).

Every message is a fixed header followed by an opcode's fixed argument struct (and, for
some, a name); every struct is little-endian on the machines we run on, so native byte
order (``=``) with explicit sizes is right. The structs are compiled once here, since the
server packs or unpacks several per request.
"""

from __future__ import annotations

import struct

#: The protocol this server speaks: 7.23 is the oldest whose structs it uses unchanged
#: (the full-size ``fuse_init_out``), 7.40 the newest whose additions it knows (7.40:
#: passthrough, its ``backing_id`` and ``max_stack_depth``).
KERNEL_VERSION = 7
MIN_MINOR = 23
MAX_MINOR = 40

#: ioctl(new_fd, FUSE_DEV_IOC_CLONE, &old_fd) = _IOR(229, 0, uint32_t): attach a fresh
#: /dev/fuse file to old_fd's connection, with a request queue of its own.
FUSE_DEV_IOC_CLONE = 0x8004E500
#: ioctl(fd, FUSE_DEV_IOC_BACKING_OPEN, &fuse_backing_map) = _IOW(229, 1, 16 bytes): register
#: an open file as a backing file of fd's connection; returns its backing id (> 0).
FUSE_DEV_IOC_BACKING_OPEN = 0x4010E501
#: ioctl(fd, FUSE_DEV_IOC_BACKING_CLOSE, &backing_id) = _IOW(229, 2, uint32_t)
FUSE_DEV_IOC_BACKING_CLOSE = 0x4004E502

# -- opcodes -------------------------------------------------------------------------------
LOOKUP = 1
FORGET = 2
GETATTR = 3
SETATTR = 4
READLINK = 5
SYMLINK = 6
MKNOD = 8
MKDIR = 9
UNLINK = 10
RMDIR = 11
RENAME = 12
LINK = 13
OPEN = 14
READ = 15
WRITE = 16
STATFS = 17
RELEASE = 18
SETXATTR = 21
GETXATTR = 22
LISTXATTR = 23
REMOVEXATTR = 24
FLUSH = 25
INIT = 26
OPENDIR = 27
READDIR = 28
RELEASEDIR = 29
ACCESS = 34
CREATE = 35
INTERRUPT = 36
DESTROY = 38
IOCTL = 39  # no handler: ENOSYS (counted by name in a mount's report)
BATCH_FORGET = 42
READDIRPLUS = 44
FALLOCATE = 43
RENAME2 = 45
COPY_FILE_RANGE = 47
TMPFILE = 51

#: Requests that would change the file system: EROFS (the read-only mount stops most of
#: them in the VFS already; these are what could still arrive).
WRITE_OPCODES = (SETATTR, SYMLINK, MKNOD, MKDIR, UNLINK, RMDIR, RENAME, LINK, WRITE,
                 SETXATTR, REMOVEXATTR, CREATE, FALLOCATE, RENAME2, COPY_FILE_RANGE, TMPFILE)
#: Notifications: written like an answer with ``unique`` 0 and the code as ``error``.
NOTIFY_STORE = 4  # put data in a file's page cache

#: Requests the kernel expects no reply to.
NO_REPLY_OPCODES = (FORGET, BATCH_FORGET, INTERRUPT)

# -- FUSE_INIT flags -----------------------------------------------------------------------
ASYNC_READ = 1 << 0  # several reads of one file at once (readahead in parallel)
DO_READDIRPLUS = 1 << 13  # listings carry each entry's attributes: the kernel keeps them
NO_OPEN_SUPPORT = 1 << 17  # (from the kernel) OPEN may be answered ENOSYS: never sent again
PARALLEL_DIROPS = 1 << 18  # lookups and readdirs of one directory in parallel
MAX_PAGES = 1 << 22  # init_out.max_pages is valid: reads up to max_pages pages per request
CACHE_SYMLINKS = 1 << 23  # the kernel keeps READLINK answers in its page cache
NO_OPENDIR_SUPPORT = 1 << 24  # (from the kernel) the same for OPENDIR
INIT_EXT = 1 << 30  # flags2 in fuse_init_in/out carries flags 32-63
#: (flags 32-63: as one 64-bit value, flags | flags2 << 32)
PASSTHROUGH = 1 << 37  # opens may name a backing file whose reads the kernel does itself

# -- open_out.open_flags -------------------------------------------------------------------
FOPEN_DIRECT_IO = 1 << 0  # reads bypass the page cache, each goes to the server as asked
FOPEN_KEEP_CACHE = 1 << 1  # do not drop the file's cached pages on open
FOPEN_CACHE_DIR = 1 << 3  # the kernel may cache this directory's listing
FOPEN_NOFLUSH = 1 << 5  # no FLUSH on close (nothing is ever written)
FOPEN_PASSTHROUGH = 1 << 7  # reads and mmaps go to the backing file open_out names

# -- structs -------------------------------------------------------------------------------
#: fuse_in_header: len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding
IN_HEADER = struct.Struct("=IIQQIIIHH")
#: fuse_out_header: len, error (negative errno), unique
OUT_HEADER = struct.Struct("=IiQ")
#: fuse_init_in (the start of it): major, minor, max_readahead, flags
INIT_IN = struct.Struct("=IIII")
#: fuse_init_in from 7.36 with FUSE_INIT_EXT (the start of it): ..., flags, flags2
INIT_IN_EXT = struct.Struct("=IIIII")
#: fuse_init_out: major, minor, max_readahead, flags, max_background, congestion_threshold,
#: max_write, time_gran, max_pages, map_alignment, flags2, max_stack_depth,
#: request_timeout, unused[11]
INIT_OUT = struct.Struct("=IIIIHHIIHHIIH22x")
#: fuse_attr: ino, size, blocks, atime, mtime, ctime, atimensec, mtimensec, ctimensec,
#: mode, nlink, uid, gid, rdev, blksize, flags
ATTR = struct.Struct("=QQQQQQIIIIIIIIII")
#: fuse_entry_out without its fuse_attr: nodeid, generation, entry_valid, attr_valid,
#: entry_valid_nsec, attr_valid_nsec
ENTRY_OUT = struct.Struct("=QQQQII")
#: fuse_attr_out without its fuse_attr: attr_valid, attr_valid_nsec, dummy
ATTR_OUT = struct.Struct("=QII")
#: fuse_open_in: flags, open_flags
OPEN_IN = struct.Struct("=II")
#: fuse_open_out: fh, open_flags, backing_id
OPEN_OUT = struct.Struct("=QIi")
#: fuse_read_in (the start of it): fh, offset, size
READ_IN = struct.Struct("=QQI")
#: fuse_getxattr_in: size, padding (then the name); also fuse_getxattr_out: size, padding
XATTR_SIZE = struct.Struct("=II")
#: fuse_kstatfs: blocks, bfree, bavail, files, ffree, bsize, namelen, frsize, padding,
#: spare[6]
KSTATFS = struct.Struct("=QQQQQIIII24x")
#: fuse_dirent without its name: ino, off, namelen, type
DIRENT = struct.Struct("=QQII")
#: fuse_notify_store_out: nodeid, offset, size, padding (then the data)
NOTIFY_STORE_OUT = struct.Struct("=QQII")
#: fuse_release_in (the start of it): fh
RELEASE_IN = struct.Struct("=Q")
#: fuse_backing_map: fd, flags, padding
BACKING_MAP = struct.Struct("=iIQ")
