"""A minimal io_uring over raw system calls (ctypes + mmap): no compiled binding needed.

No Python binding of io_uring ships wheels for both x86-64 and aarch64 (the DGX Spark), and
liburing's submission helpers are inline C, so this module speaks the kernel ABI directly:
``io_uring_setup`` maps a submission ring, a completion ring and the SQE array; :meth:`Ring.push`
fills an SQE, :meth:`Ring.submit` hands every pushed SQE to the kernel in one ``io_uring_enter``
and can wait for completions, :meth:`Ring.reap` drains them. The syscall numbers (425, 426) are
the same on every Linux architecture. Only ``IORING_OP_READ`` / ``IORING_OP_WRITE`` (Linux 5.6)
are used. One thread owns a ring; nothing here is thread-safe.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct

SYS_IO_URING_SETUP = 425
SYS_IO_URING_ENTER = 426
IORING_OFF_SQ_RING = 0
IORING_OFF_CQ_RING = 0x8000000
IORING_OFF_SQES = 0x10000000
IORING_ENTER_GETEVENTS = 1
IORING_FEAT_RW_CUR_POS = 1 << 3
IORING_OP_READ = 22
IORING_OP_WRITE = 23

# struct io_uring_params: 10 u32 (sq_entries .. resv[3]), then io_sqring_offsets and
# io_cqring_offsets (8 u32 + 1 u64 each).
_PARAMS = struct.Struct("<10I8IQ8IQ")
# struct io_uring_sqe up to user_data: opcode, flags, ioprio, fd, off, addr, len, rw_flags,
# user_data (the rest of the 64 bytes stays zero).
_SQE = struct.Struct("<BBHiQQIIQ")
_SQE_SIZE = 64
_CQE = struct.Struct("<QiI")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class IoUringUnavailable(OSError):
    """The kernel refused io_uring (too old, disabled by sysctl, or blocked by seccomp)."""


def _syscall(*args: int) -> int:
    res = _libc.syscall(*(ctypes.c_long(a) for a in args))
    if res < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return res


def aligned_buffer(size: int, alignment: int = 4096) -> tuple[mmap.mmap, int]:
    """A page-aligned anonymous buffer of ``size`` bytes rounded up to ``alignment`` (O_DIRECT
    needs aligned addresses and lengths) and its address."""
    size = max(alignment, -(-size // alignment) * alignment)
    buf = mmap.mmap(-1, size)
    return buf, ctypes.addressof(ctypes.c_char.from_buffer(buf))


class Ring:
    """One io_uring instance.

    Args:
        entries: submission-queue size (requests in flight at once).

    Raises:
        IoUringUnavailable: the kernel refused to set one up.
    """

    def __init__(self, entries: int = 128) -> None:
        params = bytearray(_PARAMS.size)
        try:
            self.fd = _syscall(SYS_IO_URING_SETUP, entries,
                               ctypes.addressof((ctypes.c_char * len(params)).from_buffer(params)))
        except OSError as exc:
            raise IoUringUnavailable(exc.errno, f"io_uring_setup failed: {exc.strerror}") from None
        p = _PARAMS.unpack(params)
        sq_entries, cq_entries, features = p[0], p[1], p[5]
        sq_off, cq_off = p[10:18], p[19:27]
        if not features & IORING_FEAT_RW_CUR_POS:
            os.close(self.fd)
            raise IoUringUnavailable(0, "io_uring without IORING_OP_READ/WRITE (Linux < 5.6)")
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        prot = mmap.PROT_READ | mmap.PROT_WRITE
        self.sq = mmap.mmap(self.fd, sq_off[6] + sq_entries * 4, flags, prot,
                            offset=IORING_OFF_SQ_RING)
        self.cq = mmap.mmap(self.fd, cq_off[5] + cq_entries * _CQE.size, flags, prot,
                            offset=IORING_OFF_CQ_RING)
        self.sqes = mmap.mmap(self.fd, sq_entries * _SQE_SIZE, flags, prot, offset=IORING_OFF_SQES)
        self.sq_head = ctypes.c_uint32.from_buffer(self.sq, sq_off[0])
        self.sq_tail = ctypes.c_uint32.from_buffer(self.sq, sq_off[1])
        self.sq_mask = ctypes.c_uint32.from_buffer(self.sq, sq_off[2]).value
        self.sq_array = sq_off[6]
        self.cq_head = ctypes.c_uint32.from_buffer(self.cq, cq_off[0])
        self.cq_tail = ctypes.c_uint32.from_buffer(self.cq, cq_off[1])
        self.cq_mask = ctypes.c_uint32.from_buffer(self.cq, cq_off[2]).value
        self.cqes = cq_off[5]
        self.entries = sq_entries
        self.num_pushed = 0
        self.num_in_flight = 0

    @property
    def num_free(self) -> int:
        """SQEs that can be pushed before the next :meth:`submit`."""
        return self.entries - self.num_in_flight - self.num_pushed

    def push(self, opcode: int, fd: int, addr: int, length: int, offset: int,
             user_data: int) -> None:
        """Queue one read or write of ``length`` bytes at ``addr`` / file ``offset``."""
        if self.num_free <= 0:
            raise RuntimeError("io_uring submission queue is full; submit and reap first")
        tail = self.sq_tail.value
        index = tail & self.sq_mask
        at = index * _SQE_SIZE
        self.sqes[at:at + _SQE_SIZE] = bytes(_SQE_SIZE)
        _SQE.pack_into(self.sqes, at, opcode, 0, 0, fd, offset, addr, length, 0, user_data)
        struct.pack_into("<I", self.sq, self.sq_array + 4 * index, index)
        self.sq_tail.value = (tail + 1) & 0xFFFFFFFF
        self.num_pushed += 1

    def submit(self, wait: int = 0) -> None:
        """Hand the pushed SQEs to the kernel (one system call) and wait for ``wait``
        completions."""
        to_submit, self.num_pushed = self.num_pushed, 0
        while True:
            try:
                done = _syscall(SYS_IO_URING_ENTER, self.fd, to_submit, wait,
                                IORING_ENTER_GETEVENTS if wait else 0, 0, 0)
            except InterruptedError:
                continue
            break
        self.num_in_flight += done
        self.num_pushed += to_submit - done

    def reap(self) -> list[tuple[int, int]]:
        """``(user_data, result)`` of every completion posted so far (result < 0: -errno)."""
        out = []
        head, tail = self.cq_head.value, self.cq_tail.value
        while head != tail:
            at = self.cqes + (head & self.cq_mask) * _CQE.size
            user_data, res, _ = _CQE.unpack_from(self.cq, at)
            out.append((user_data, res))
            head = (head + 1) & 0xFFFFFFFF
        self.cq_head.value = head
        self.num_in_flight -= len(out)
        return out

    def close(self) -> None:
        for name in ("sq_head", "sq_tail", "cq_head", "cq_tail"):
            delattr(self, name)
        for m in (self.sq, self.cq, self.sqes):
            m.close()
        os.close(self.fd)
