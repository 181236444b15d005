"""Double-buffered host -> device uploads of CSR chunks through pinned memory.

Used by :func:`sklearn_cuwide._layout.build_layout` when it builds the layout
on the GPU from a host (scipy) matrix: while the GPU sorts chunk ``i``, a
worker thread gathers chunk ``i + 1`` into a pinned buffer, and a second
stream then copies it to the device while the GPU finishes chunk ``i``.

Two slots, each a pinned host buffer and a device buffer for a chunk's
``(indptr, indices, data)``.  Chunk ``n`` uses slot ``n % 2``.  Events order
the work:

* ``copied[s]`` (on the copy stream, after the copy out of slot ``s``): the
  compute stream waits for it before reading the device buffer, and the host
  synchronizes on it before the pinned buffer of slot ``s`` is written again;
* ``released[s]`` (on the compute stream, after the kernels that read the
  device buffer of slot ``s`` were enqueued): the copy stream waits for it
  before overwriting that device buffer.

Threads.  Every device call is made on the calling thread; the worker only
runs numpy on host arrays.  ``cupy.argsort`` blocks the calling thread for
the whole sort (in the cupy sources: thrust's synchronizing ``par`` policy,
called with the GIL held), so a gather can only run during the sort on
another thread; it overlaps the sort with the numpy call it is in, and runs
on during the host's other waits (which release the GIL).

This module does not import cupy: the array module comes in as ``xp``
(``xp.cuda.Stream``, ``xp.cuda.alloc_pinned_memory``, ...).
"""

from concurrent.futures import ThreadPoolExecutor

import numpy as np

__all__ = ["ChunkUploader"]


def pinned_empty(xp, n, dtype):
    """A numpy array of ``n`` items (at least one) in page-locked host memory."""
    dtype = np.dtype(dtype)
    n = max(int(n), 1)
    mem = xp.cuda.alloc_pinned_memory(n * dtype.itemsize)
    return np.frombuffer(mem, dtype=dtype, count=n)


class ChunkUploader:
    """Copies CSR chunks to the device on a copy stream, two at a time in flight.

    A chunk goes through :meth:`stage` (its pinned buffers are filled by a
    worker thread: plain numpy, no device call) and then :meth:`upload` (on
    the calling thread: wait for the fill, start the copy).  The worker is
    there because a cupy sort blocks the calling thread until it finishes
    (thrust synchronizes its stream), so the host gather of the next chunk
    can only run during the sort on another thread.

    Parameters
    ----------
    xp : module
        cupy.
    max_rows, max_nnz : int
        Rows and nonzeros of the largest chunk.
    index_dtype, value_dtype : dtype
        Dtypes of the chunk's ``indices`` and ``data`` (kept as they are; the
        pointer array is int64).
    timing : list or None
        If a list, ``(start, end)`` events around each chunk's copy are
        appended to it (for benchmarks).
    """

    def __init__(self, xp, max_rows, max_nnz, index_dtype, value_dtype, timing=None):
        self.xp = xp
        self.compute = xp.cuda.get_current_stream()
        # non-blocking: no implicit synchronisation with the legacy default
        # stream, which may be the compute stream
        self.copy = xp.cuda.Stream(non_blocking=True)
        specs = (
            (max_rows + 1, np.int64),
            (max_nnz, np.dtype(index_dtype)),
            (max_nnz, np.dtype(value_dtype)),
        )
        self.host = [[pinned_empty(xp, n, dt) for n, dt in specs] for _ in range(2)]
        self.dev = [[xp.empty(max(n, 1), dtype=dt) for n, dt in specs] for _ in range(2)]
        self.copied = [None, None]
        self.released = [None, None]
        self.timing = timing
        self._next = 0
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cuwide-stage")

    def stage(self, fill, n_rows, nnz):
        """Start filling the next slot's pinned buffers on the worker thread.

        ``fill(indptr, indices, data)`` writes the chunk into the three pinned
        views it is given (``n_rows + 1``, ``nnz`` and ``nnz`` items); it must
        not call the device.  Returns a ticket for :meth:`upload`.
        """
        s = self._next
        self._next ^= 1
        if self.copied[s] is not None:
            self.copied[s].synchronize()  # the last copy out of this pinned slot is done
        sizes = (n_rows + 1, nnz, nnz)
        host = [h[:k] for h, k in zip(self.host[s], sizes)]
        return s, sizes, host, self._worker.submit(fill, *host)

    def upload(self, ticket):
        """Wait for a staged fill and start its copy on the copy stream.

        Returns ``(slot, (indptr, indices, data))``: device views that the
        compute stream may read once :meth:`acquire` was called for ``slot``.
        """
        s, sizes, host, done = ticket
        done.result()  # the fill is complete (and re-raises its errors)
        if self.released[s] is not None:
            # the kernels that read this device slot come first
            self.copy.wait_event(self.released[s])
        dev = [d[:k] for d, k in zip(self.dev[s], sizes)]
        start = self.copy.record() if self.timing is not None else None
        for d, h in zip(dev, host):
            if h.shape[0]:
                d.set(h, stream=self.copy)
        self.copied[s] = self.copy.record()
        if self.timing is not None:
            self.timing.append((start, self.copied[s]))
        return s, tuple(dev)

    def acquire(self, slot):
        """Make the compute stream wait for the copy into ``slot``."""
        self.compute.wait_event(self.copied[slot])

    def release(self, slot):
        """The kernels reading ``slot`` are enqueued on the compute stream."""
        self.released[slot] = self.compute.record()

    def close(self):
        """Wait for the worker and every copy (the buffers may then be freed)."""
        self._worker.shutdown(wait=True)
        self.copy.synchronize()
