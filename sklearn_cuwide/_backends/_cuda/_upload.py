"""Host -> device copies through two pinned slots on a copy stream (and
the way back of large arrays through page-locked memory, :func:`download`).

:class:`PinnedUploader` is the CUDA backend's one double-buffered uploader.
It serves the upload of a host CSR matrix as it is (:func:`upload_csr`,
contiguous runs of nonzeros, for :func:`build_on_device`, where everything
else runs on the device), the GPU build of a host matrix planned on the host
(:func:`build_from_host`: while the GPU sorts chunk ``i``, a worker thread
gathers chunk ``i + 1`` into pinned memory and the copy stream then copies
it while the GPU finishes chunk ``i``) and the streamed nonzeros of a
host-built layout
(:func:`stream_chunks`, behind ``DeviceLayout.stream_chunks``: chunk
``i + 1`` is copied while the kernel trains on chunk ``i``).

Two slots, each a pinned host buffer and (unless the caller gives the
destination) a device buffer per array.  Chunk ``n`` uses slot ``n % 2``.
Events order the work:

* ``copied[s]`` (on the copy stream, after the copy out of slot ``s``): the
  compute stream waits for it before reading the copy, and the host
  synchronizes on it before the pinned buffer of slot ``s`` is written again;
* ``released[s]`` (on the compute stream, after the kernels that read the
  device buffer of slot ``s`` were enqueued): the copy stream waits for it
  before overwriting that device buffer.  The events outlive a pass, so the
  first copies of the next pass wait for the last kernels of this one;
* one event on the compute stream when the uploader is made: the memory pool
  reuses a block in the order of the stream that freed it (the compute
  stream), so a block handed to a destination may still be written by
  kernels queued there, and the copy stream starts after them.

Threads.  Every device call is made on the calling thread; the worker only
runs numpy on host arrays.  ``cupy.argsort`` blocks the calling thread for
the whole sort (thrust's synchronizing policy, called with the GIL held), so
a gather can only overlap the sort on another thread.

Rule: this module takes the array module as ``xp`` (cupy) and imports no
cupy.  Why: the CPU tests drive it with a numpy stand-in whose copies are
deferred until waited for, which checks the event ordering without a GPU.
"""

from concurrent.futures import Future, ThreadPoolExecutor, wait

import numpy as np

from ... import _layout
from ..._host import copy_rows
from ..._validation import HOST_THREADS, host_pool

__all__ = ["PinnedUploader", "StagedInput", "HeldOut", "build_site", "split_copy", "upload_csr",
           "build_on_device", "build_from_host", "stream_chunks", "is_pinned",
           "pinned_empty", "download"]

#: device arrays smaller than this come back to the host by one ordinary copy
DOWNLOAD_MIN_BYTES = 16 << 20
#: bytes of the page-locked buffer a larger one comes back through, a piece at a time
DOWNLOAD_CHUNK_BYTES = 64 << 20


def pinned_empty(xp, n, dtype, pooled=True):
    """A numpy array of ``n`` items (at least one) in page-locked host
    memory: from CuPy's pinned pool, or (``pooled=False``) its own
    allocation, given back to the system when the array goes (a layout of
    gigabytes is not kept cached after its fit)."""
    dtype = np.dtype(dtype)
    n = max(int(n), 1)
    if pooled:
        mem = xp.cuda.alloc_pinned_memory(n * dtype.itemsize)
    else:
        mem = xp.cuda.PinnedMemoryPointer(xp.cuda.PinnedMemory(n * dtype.itemsize), 0)
    return np.frombuffer(mem, dtype=dtype, count=n)


def download(xp, a, chunk_bytes=DOWNLOAD_CHUNK_BYTES):
    """A device array as a new numpy array of its shape and dtype.

    From :data:`DOWNLOAD_MIN_BYTES` on, a piece at a time through one
    page-locked buffer (CuPy's pinned pool), each piece then copied out of
    it on every core (:func:`sklearn_cuwide._host.copy_rows`); a smaller
    array by one ordinary copy.  Why: ``cupy.asnumpy`` copies into pageable
    memory, which the driver stages itself at a few GB/s (a fitted state of
    8.9 GB took 4.3 s on the H200).  The copies are synchronous: each piece
    is in the buffer when its ``get`` returns."""
    if a.nbytes < DOWNLOAD_MIN_BYTES:
        return a.get()
    src = xp.ascontiguousarray(a).reshape(-1)
    out = np.empty(a.shape, dtype=a.dtype)
    flat = out.reshape(-1)
    step = max(1, int(chunk_bytes) // a.dtype.itemsize)
    buf = pinned_empty(xp, min(step, src.size), a.dtype)
    for s in range(0, src.size, step):
        e = min(src.size, s + step)
        src[s:e].get(out=buf[: e - s])
        copy_rows(flat[s:e], buf[: e - s])
    return out


def _pinned_or_pageable(xp, n, dtype):
    """``n`` items in page-locked host memory of their own, or, when the
    system refuses to lock that much, in ordinary memory (each epoch then
    stages the copies through the uploader's pinned slots)."""
    errors = (MemoryError,
              getattr(getattr(xp.cuda, "runtime", None), "CUDARuntimeError", MemoryError))
    try:
        return pinned_empty(xp, n, dtype, pooled=False)[:n]
    except errors:
        return np.empty(n, dtype=dtype)


def is_pinned(xp, a):
    """Whether numpy array ``a`` is a view of memory from
    ``xp.cuda.alloc_pinned_memory`` (:func:`pinned_empty`)."""
    kind = getattr(xp.cuda, "PinnedMemoryPointer", None)
    while a is not None and kind is not None:
        if isinstance(a, memoryview):
            a = a.obj
        if isinstance(a, kind):
            return True
        a = getattr(a, "base", None)
    return False


class PinnedUploader:
    """Copies groups of host arrays to the device, two groups in flight.

    A group goes through :meth:`stage` (a worker thread fills the slot's
    pinned buffers: plain numpy, no device call) and then :meth:`upload` (on
    the calling thread: wait for the fill, start the copies).  The compute
    stream reads it after :meth:`acquire` and hands the slot back with
    :meth:`release` once the kernels that read it are enqueued.

    Parameters
    ----------
    xp : module
        cupy.
    specs : list of (int, dtype)
        Most items and dtype of each array of a group.
    device_buffers : bool, default=True
        Allocate a device buffer per array and slot to copy into; ``False``
        when every :meth:`upload` gives its destination.
    host_buffers : bool, default=True
        Allocate the slots' pinned buffers; ``False`` when every group is
        already in pinned memory (:meth:`stage_pinned`).
    pooled : bool, default=True
        The slots' pinned buffers from CuPy's pinned pool (kept for the
        next uploader), or allocations of their own, freed with them.
    """

    def __init__(self, xp, specs, device_buffers=True, host_buffers=True, pooled=True):
        self.xp = xp
        # non-blocking: no implicit synchronisation with the legacy default
        # stream, which may be the compute stream
        self.copy = xp.cuda.Stream(non_blocking=True)
        self.host = None
        if host_buffers:
            self.host = [[pinned_empty(xp, n, dt, pooled=pooled) for n, dt in specs]
                         for _ in range(2)]
        self.dev = None
        if device_buffers:
            self.dev = [[xp.empty(max(int(n), 1), dtype=dt) for n, dt in specs]
                        for _ in range(2)]
        # the pool hands out blocks that kernels still queued on the compute
        # stream may write (it orders reuse by that stream, not this one):
        # the copies into them start after that stream's work so far
        self.copy.wait_event(xp.cuda.get_current_stream().record())
        self.copied = [None, None]
        self.released = [None, None]
        self._next = 0
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cuwide-stage")

    def stage(self, fill, sizes):
        """Start filling the next slot's pinned buffers on the worker thread.

        ``fill(*arrays)`` writes the group into the pinned views it is given
        (``sizes`` items each); it must not call the device.  Returns a
        ticket for :meth:`upload`.
        """
        s = self._next
        self._next ^= 1
        if self.copied[s] is not None:
            self.copied[s].synchronize()  # the last copy out of this pinned slot is done
        host = [h[:k] for h, k in zip(self.host[s], sizes)]
        return s, sizes, host, self._worker.submit(fill, *host)

    def stage_pinned(self, arrays):
        """A group already in page-locked memory (views the copies read
        where they are: no fill, no slot buffer).  Returns a ticket for
        :meth:`upload`."""
        s = self._next
        self._next ^= 1
        done = Future()
        done.set_result(None)
        return s, tuple(int(a.shape[0]) for a in arrays), list(arrays), done

    def upload(self, ticket, into=None):
        """Wait for a staged fill and start its copies on the copy stream.

        ``into``: device arrays to copy into, allocated before this uploader
        was made (its copy stream waited for the compute stream then; the
        caller orders their reuse), or ``None`` for the slot's device buffers
        (after the kernels that last read them).  Returns ``(slot, device arrays)``, which the compute
        stream may read once :meth:`acquire` was called for ``slot``.
        """
        s, sizes, host, done = ticket
        done.result()  # the fill is complete (and re-raises its errors)
        if into is None:
            if self.released[s] is not None:
                self.copy.wait_event(self.released[s])
            into = [d[:k] for d, k in zip(self.dev[s], sizes)]
        for d, h in zip(into, host):
            if h.shape[0]:
                d.set(h, stream=self.copy)
        self.copied[s] = self.copy.record()
        return s, tuple(into)

    def acquire(self, slot, stream):
        """Make ``stream`` (the compute stream) wait for the copy into ``slot``."""
        stream.wait_event(self.copied[slot])

    def release(self, slot, stream):
        """The kernels reading ``slot`` are enqueued on ``stream``."""
        self.released[slot] = stream.record()

    def close(self):
        """Wait for the worker and every copy (the buffers may then be freed)."""
        self._worker.shutdown(wait=True)
        self.copy.synchronize()


def build_from_host(X, xp, *, dtype=np.float32, chunk_nnz=1 << 23, host_out=False,
                    **plan_kw):
    """:func:`sklearn_cuwide._layout.build_layout` of a host (scipy) matrix
    on the GPU, the chunks' gathers and copies overlapped with the sorts.

    ``plan_kw``: the planning keywords of
    :func:`~sklearn_cuwide._layout.plan_layout`.  ``host_out``: the layout's
    nonzeros in page-locked host memory (each chunk copied out once sorted:
    a layout streamed in every epoch, its copies read it where it is); the
    device then holds one chunk's work at a time.  Same layout, bit for
    bit, as the numpy build.
    """
    kernels = plan_kw.pop("kernels", None)  # the tiling's: the plan is the host's
    plan = _layout.plan_layout(X, chunk_nnz=chunk_nnz, **plan_kw)
    n = len(plan.chunks)
    empty = (lambda k, dt: _pinned_or_pageable(xp, k, dt)) if host_out else None
    if n < 2:  # nothing to overlap: one synchronous copy, no pinned buffers
        return _layout.tile_layout(plan, xp, dtype, empty=empty, kernels=kernels)
    _, indices, data = plan.source
    rows = max(r1 - r0 for r0, r1 in map(plan.chunk_rows, range(n)))
    nnz = max(map(plan.chunk_nnz, range(n)))
    tiler = _layout.LayoutTiler(plan, xp, dtype, empty=empty, kernels=kernels)
    # a layout built into host memory is streamed: the build's slots are
    # freed with it, not kept in CuPy's pinned pool through the epochs
    up = PinnedUploader(xp, [(rows + 1, np.int64), (nnz, indices.dtype), (nnz, data.dtype)],
                        pooled=not host_out)
    compute = xp.cuda.get_current_stream()

    def stage(k):
        r0, r1 = plan.chunk_rows(k)
        nc = plan.chunk_nnz(k)
        return up.stage(lambda *bufs: plan.read_chunk_into(k, *bufs), (r1 - r0 + 1, nc, nc))

    try:
        ready = up.upload(stage(0))
        for k in range(n):
            if k + 1 < n:  # the worker gathers the next chunk meanwhile
                pending = stage(k + 1)
            slot, chunk = ready
            up.acquire(slot, compute)
            sorted_chunk = tiler.sort(k, *chunk)
            del chunk
            # this chunk's kernels are enqueued and nothing reads its slot any
            # more: start the next chunk's copy (it runs while the GPU finishes
            # this chunk), then the host syncs of this chunk in store()
            up.release(slot, compute)
            if k + 1 < n:
                ready = up.upload(pending)
            tiler.store(sorted_chunk)
            del sorted_chunk
    finally:
        up.close()  # the worker and every copy done: the buffers may go
    return tiler.finish()


#: device bytes of the layout per nonzero (int32 feature, uint16 row,
#: float32 value) and the allowance for the build's temporaries
LAYOUT_BYTES_PER_NNZ = 10
LAYOUT_SLACK = 64 << 20


def build_site(nnz, n_rows, index_itemsize, value_itemsize, budget, *, on_device):
    """Where the training layout of a matrix is built, for ``budget`` bytes
    of device memory.

    * ``"device"``: the whole build on the device
      (:func:`build_on_device` for a host matrix: its CSR is uploaded as it
      is, then planned, shuffled and tiled there); a host matrix's CSR and
      the layout must fit together (the CSR is freed once the layout is
      built), a device matrix's layout alone;
    * ``"host_plan"``: planned on the host, each chunk's rows gathered there
      and uploaded to be tiled on the device (:func:`build_from_host`): the
      layout fits, not the CSR beside it;
    * ``"host"``: built on the host, its nonzeros streamed in every epoch.

    Rule: the one place that decides, from sizes only (no device call), so
    that a memory planner can answer it instead.
    """
    layout = int(nnz) * LAYOUT_BYTES_PER_NNZ + LAYOUT_SLACK
    if layout > budget:
        return "host"
    if on_device:
        return "device"
    csr = (int(n_rows) + 1) * 8 + int(nnz) * (int(index_itemsize) + int(value_itemsize))
    return "device" if csr + layout <= budget else "host_plan"


#: pieces a pinned slot's fill is cut into, run on the host pool: one
#: core's copy out of pageable memory is slower than the copy engine's from
#: pinned memory (docs/design/layout_build.rst)
FILL_THREADS = HOST_THREADS


def split_copy(pool, pairs, n_parts):
    """``dst[...] = src`` for each ``(dst, src)`` of ``pairs`` (1-D arrays of
    one length each pair), in ``n_parts`` contiguous pieces run on ``pool``
    (numpy releases the GIL while it copies); returns when all are done."""
    jobs = []
    for dst, src in pairs:
        n = int(src.shape[0])
        cuts = [n * i // n_parts for i in range(n_parts + 1)]
        for a, b in zip(cuts[:-1], cuts[1:]):
            if b > a:
                jobs.append(pool.submit(np.copyto, dst[a:b], src[a:b]))
    for j in jobs:
        j.result()


def upload_csr(X, xp, *, chunk_nnz=1 << 22, fill_threads=None):
    """The arrays of a host (scipy) CSR matrix on the device, as they are:
    ``(indptr, indices, data)`` of ``xp``, ``indptr`` int64, the indices
    and values of their dtypes, unsorted, duplicates and zeros kept.

    ``indptr`` (O(n_rows)) is copied at once.  The nonzeros cross in
    contiguous runs of ``chunk_nnz`` through a :class:`PinnedUploader`, each
    to its place in the device arrays: the worker thread copies run
    ``k + 1`` into the other pinned slot while the copy stream copies run
    ``k``, in ``fill_threads`` pieces at once (default
    :data:`FILL_THREADS`).  No pass over the nonzeros besides those copies:
    they are neither gathered, nor sorted, nor counted on the host.
    Returns when every copy is complete (the compute stream waited for each
    too).
    """
    _, indptr, indices, data = _layout._csr_parts(X)
    nnz = int(indptr[-1])
    d_indptr = xp.asarray(np.asarray(indptr, dtype=np.int64))
    d_indices = xp.empty(nnz, dtype=indices.dtype)
    d_data = xp.empty(nnz, dtype=data.dtype)
    step = max(1, int(chunk_nnz))
    bounds = [(a, min(nnz, a + step)) for a in range(0, nnz, step)]
    if not bounds:
        return d_indptr, d_indices, d_data
    most = bounds[0][1] - bounds[0][0]
    up = PinnedUploader(xp, [(most, indices.dtype), (most, data.dtype)], device_buffers=False)
    compute = xp.cuda.get_current_stream()
    n_fill = max(1, int(FILL_THREADS if fill_threads is None else fill_threads))
    pool = host_pool()

    def stage(a, b):
        def fill(idx, val):
            split_copy(pool, [(idx, indices[a:b]), (val, data[a:b])], n_fill)

        return up.stage(fill, (b - a, b - a))

    try:
        ticket = stage(*bounds[0])
        for k, (a, b) in enumerate(bounds):
            slot, _ = up.upload(ticket, into=[d_indices[a:b], d_data[a:b]])
            up.acquire(slot, compute)
            if k + 1 < len(bounds):  # the worker fills the other slot meanwhile
                ticket = stage(*bounds[k + 1])
    finally:
        up.close()  # every copy done: the pinned buffers may go
    return d_indptr, d_indices, d_data


class HeldOut:
    """:meth:`StagedInput.hold_out`'s handle: ``result()`` is the rows on
    the device once the build has taken the staged copy, else (a build that
    never took it) the rows of the host matrix, gathered there."""

    def __init__(self, X, rows):
        self.X, self.rows, self.matrix = X, rows, None

    def result(self):
        return self.X[self.rows] if self.matrix is None else self.matrix


class StagedInput:
    """What :func:`build_on_device` reads first, begun before it is called:
    the upload of a host CSR (:func:`upload_csr`, driven from a thread of
    its own) while the fit goes on with its early-stopping split and its
    step parameters, which need none of it.  (The layout's row order is
    drawn on the device by the build: no host pass competes with the
    upload's fills.)

    :meth:`take` hands the device arrays over once (the handle keeps no
    reference to them after); :meth:`close` waits for the work, so that an
    interrupted fit's device arrays are freed after their copies end.
    Rows named by :meth:`hold_out` (early stopping's held-out rows) are
    gathered from the uploaded copy once the layout is built from it
    (:meth:`gather_held`): the host neither gathers nor copies them, and
    the build's sorts run without their copy beside them.
    ``gather``: ``(indptr, indices, data, shape, rows) -> matrix``, those
    rows of the uploaded arrays as a device matrix (None: no gather there);
    ``matrix``: ``(indptr, indices, data, shape) -> matrix``, the uploaded
    arrays as one (None: :meth:`matrix` gives ``X``).
    """

    def __init__(self, X, xp, n_rows, upload_chunk_nnz=1 << 22, gather=None, matrix=None):
        self.X, self.n_rows, self._gather, self._matrix = X, int(n_rows), gather, matrix
        self._held = None
        device = xp.cuda.Device()  # the fit's: the thread's own starts at device 0

        def upload():
            with device:
                return upload_csr(X, xp, chunk_nnz=upload_chunk_nnz)

        # a thread of its own: it hands the fills to the host pool, which a
        # task of that pool must not wait on
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cuwide-stage")
        self._csr = self._thread.submit(upload)
        self._thread.shutdown(wait=False)  # the thread ends with its task

    def hold_out(self, rows):
        """A :class:`HeldOut` of the rows ``rows`` (sorted numpy indices) of
        ``X``, gathered on the device by :meth:`gather_held`."""
        self._held = HeldOut(self.X, rows)
        return self._held

    def uploaded(self):
        """The uploaded ``(indptr, indices, data)``, waiting for them, kept
        for :meth:`take` (the input's checks read them first)."""
        return self._csr.result()

    def matrix(self):
        """The uploaded copy as a device matrix, waiting for it (``X`` where
        no ``matrix`` was given): for what reads ``X`` before the build."""
        if self._matrix is None:
            return self.X
        return self._matrix(*self.uploaded(), self.X.shape)

    def take(self):
        """The uploaded ``(indptr, indices, data)``, waiting for them."""
        csr, self._csr = self._csr.result(), None
        return csr

    def gather_held(self, csr):
        """The rows of :meth:`hold_out`, gathered from ``csr`` (the arrays
        :meth:`take` handed over) into their handle; once only."""
        held, self._held = self._held, None
        if held is not None and self._gather is not None:
            held.matrix = self._gather(*csr, self.X.shape, held.rows)

    def close(self):
        """Wait for what is still running (and drop its results)."""
        if self._csr is not None:
            wait([self._csr])
        self._csr = None


def build_on_device(X, xp, *, dtype=np.float32, chunk_nnz=1 << 23,
                    upload_chunk_nnz=1 << 22, staged=None, **plan_kw):
    """:func:`sklearn_cuwide._layout.build_layout` of a host (scipy) matrix
    with every pass over its nonzeros on the device: the CSR uploaded as it
    is (:func:`upload_csr`), then planned, shuffled and tiled there
    (:func:`sklearn_cuwide._layout.build_layout_csr`, sorting ``chunk_nnz``
    nonzeros at a time; with the build's kernels in ``plan_kw`` the row
    order is drawn there too).  The host computes what is O(n_rows /
    batch_size + n_features).  Same layout, bit for bit, as the numpy
    build; the device holds the CSR and the layout until it returns.
    ``staged``: a :class:`StagedInput` of ``X`` and of these rows, whose
    upload is used.
    """
    rows = plan_kw.get("rows")
    n_rows = X.shape[0] if rows is None else len(rows)
    if staged is None:
        staged = StagedInput(X, xp, n_rows, upload_chunk_nnz)
    elif staged.X is not X or staged.n_rows != n_rows:
        raise ValueError("the staged input is of another matrix or number of rows")
    csr = staged.take()
    layout = _layout.build_layout_csr(X.shape, *csr, xp=xp, dtype=dtype, chunk_nnz=chunk_nnz,
                                      **plan_kw)
    # after the build: the peak of its sorts holds no copy of the held-out rows
    staged.gather_held(csr)
    return layout


def stream_chunks(up, host_arrays, bounds, order, compute_stream, resident=None,
                  pinned=False):
    """Copy chunks of host arrays to the device through ``up``, one ahead.

    Chunk ``k`` is ``a[bounds[k][0]:bounds[k][1]]`` of each array of
    ``host_arrays``.  Yields ``(k, device arrays, base)`` for each ``k`` of
    ``order`` after making ``compute_stream`` wait for its copy; the caller
    enqueues the kernels that read it (entry ``i`` of the chunk at
    ``i - base``) before asking for the next.  ``resident``: device arrays
    of the whole length that the chunks are copied into at their place
    (``base`` 0, kept after the pass), or ``None`` to copy each chunk into
    a slot's device buffers (``base`` the chunk's start).  ``pinned``: the
    host arrays are in page-locked memory, copied from where they are
    (:meth:`PinnedUploader.stage_pinned`) instead of through a slot.
    """

    def stage(k):
        a, b = bounds[k]
        if pinned:
            return up.stage_pinned([src[a:b] for src in host_arrays])

        def fill(*bufs):
            for src, dst in zip(host_arrays, bufs):
                dst[...] = src[a:b]

        return up.stage(fill, (b - a,) * len(host_arrays))

    def upload(k, ticket):
        if resident is None:
            return up.upload(ticket)
        a, b = bounds[k]
        return up.upload(ticket, into=[d[a:b] for d in resident])

    if not order:
        return
    pending = None  # a fill on the worker thread not yet handed to upload()
    done = False
    try:
        ready = upload(order[0], stage(order[0]))
        for n, k in enumerate(order):
            if n + 1 < len(order):  # the worker copies the next chunk to pinned memory
                pending = stage(order[n + 1])
            slot, arrays = ready
            up.acquire(slot, compute_stream)
            if resident is None:
                yield k, arrays, bounds[k][0]
            else:
                yield k, tuple(resident), 0
            up.release(slot, compute_stream)
            if n + 1 < len(order):
                ready, pending = upload(order[n + 1], pending), None
        done = True
    finally:
        if not done:
            _drain(up, pending, compute_stream)


def _drain(up, pending, compute_stream):
    """After an interrupted :func:`stream_chunks` (an error, a
    ``KeyboardInterrupt``, or the consumer closing the generator): wait
    until nothing writes into or reads from the uploader's buffers, so that
    they may be released (the caller's arrays, a dropped layout).

    The worker's fill of the next slot (``pending``) writes its pinned
    buffer; the copy stream may still copy out of a pinned buffer into a
    device buffer (a slot's, or the resident arrays), and the compute
    stream's kernels may read one.  Freed device memory is reused in the
    order of the stream it was allocated on (the compute stream), which
    does not order the copy stream: hence both synchronisations.  Their own
    errors are dropped: an error is already on its way out (or, for a closed
    generator, the device reports it again at its next synchronisation).
    """
    if pending is not None:
        wait([pending[-1]])  # the fill's own error, if any, goes with it
    for stream in (up.copy, compute_stream):
        try:
            stream.synchronize()
        except Exception:  # noqa: BLE001 - see the docstring
            pass
