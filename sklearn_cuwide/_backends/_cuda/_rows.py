"""Model rows between the device and page-locked host memory
(``cuda/cuwide_rows.cu``): the cold rows of a model wider than the device
(:mod:`sklearn_cuwide._out_of_core`)."""

import math

import cupy as cp
import numpy as np

from ..._host import copy_rows
from ..._kernels import get_kernel
from ..._out_of_core import PIECE_ROWS
from ._upload import _pinned_or_pageable, is_pinned

__all__ = ["host_rows", "empty_host_rows", "gather_rows", "scatter_rows"]

_THREADS = 256
_MAX_BLOCKS = 1 << 15


def host_rows(a):
    """``a`` (numpy, rows first) copied into page-locked host memory of its
    own, which the row kernels read and write in place; ``a`` itself when
    the system refuses to lock that much (its rows then move through
    ordinary copies, :data:`PIECE_ROWS` at a time)."""
    if is_pinned(cp, a):  # made by empty_host_rows: in place
        return a
    a = np.ascontiguousarray(a)
    out = _pinned_or_pageable(cp, a.size, a.dtype)
    if not is_pinned(cp, out):  # refused: no copy of it in ordinary memory
        return a
    return copy_rows(out.reshape(a.shape), a)


def empty_host_rows(shape, dtype):
    """An uninitialised numpy array of ``shape`` in page-locked host memory
    of its own (:func:`host_rows` then keeps it as it is), or in ordinary
    memory when the system refuses to lock that much."""
    shape = tuple(int(n) for n in shape)
    return _pinned_or_pageable(cp, int(np.prod(shape, dtype=np.int64)), dtype).reshape(shape)


def _row_words(host):
    row = host.dtype.itemsize * int(np.prod(host.shape[1:], dtype=np.int64))
    if row % 4:
        raise ValueError(f"rows of {row} bytes are not whole 32-bit words")
    return row // 4


def _launch(name, src, ids, n, words, stride, dst):
    blocks = max(1, min(math.ceil(n * words / _THREADS), _MAX_BLOCKS))
    get_kernel("cuwide_rows.cu", name)(
        (blocks,), (_THREADS,), (src, ids, np.int64(n), np.int32(words), np.int64(stride),
                                 dst))


def _check(host, ids, dev):
    """The device rows' stride in 32-bit words: ``dev`` (2-D) may be whole
    rows, or a view of a wider buffer's leading columns."""
    if (dev.ndim != 2 or dev.shape != (ids.shape[0],) + host.shape[1:]
            or dev.dtype != host.dtype):
        raise ValueError(f"{dev.shape} {dev.dtype} rows for {ids.shape[0]} rows of "
                         f"{host.shape} {host.dtype}")
    item = dev.dtype.itemsize
    if not host.flags.c_contiguous or (dev.shape[1] > 1 and dev.strides[1] != item):
        raise ValueError("each row must be contiguous")
    stride = dev.strides[0] if dev.shape[0] > 1 else item * dev.shape[1]
    if stride % 4:
        raise ValueError(f"rows {stride} bytes apart are not whole 32-bit words")
    return stride // 4


def gather_rows(host, ids, out):
    """``out[i] = host[ids[i]]``: ``host`` numpy (:func:`host_rows`),
    ``ids`` int64 and ``out`` on the device (each row contiguous; rows
    evenly apart, as in a view of a wider buffer's leading columns)."""
    stride = _check(host, ids, out)
    n = int(ids.shape[0])
    if n == 0:
        return out
    if is_pinned(cp, host):
        _launch("cuwide_gather_rows", np.uint64(host.ctypes.data),
                cp.ascontiguousarray(ids, dtype=cp.int64), n, _row_words(host), stride, out)
        return out
    for a in range(0, n, PIECE_ROWS):
        b = min(a + PIECE_ROWS, n)
        out[a:b] = cp.asarray(host[cp.asnumpy(ids[a:b])])
    return out


def scatter_rows(dev, ids, host):
    """``host[ids[i]] = dev[i]`` (``ids`` distinct), the arguments as
    :func:`gather_rows` takes them.  The host rows are written when the
    current stream reaches the copy (``synchronize`` before reading them)."""
    stride = _check(host, ids, dev)
    n = int(ids.shape[0])
    if n == 0:
        return host
    if is_pinned(cp, host):
        _launch("cuwide_scatter_rows", dev, cp.ascontiguousarray(ids, dtype=cp.int64), n,
                _row_words(host), stride, np.uint64(host.ctypes.data))
        return host
    for a in range(0, n, PIECE_ROWS):
        b = min(a + PIECE_ROWS, n)
        host[cp.asnumpy(ids[a:b])] = cp.asnumpy(dev[a:b])
    return host
