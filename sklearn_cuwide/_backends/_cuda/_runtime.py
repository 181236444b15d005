"""The CUDA backend's device: which GPU (per fit and thread), its
properties and memory, and moving arrays, matrices and model states between
the host and it."""

import functools
import threading
from contextlib import contextmanager
from dataclasses import dataclass

import cupy as cp
import cupyx.scipy.sparse as cpsp
import numpy as np

from ... import _memory
from ..._sparse import canonical_csr
from ..._state import ModelState
from .. import _concurrency, _tiles
from . import _reduce, _upload
from ._validate import check_index_width

#: a null device pointer, for the kernels' optional arrays
NULL = np.uint64(0)


def device_index(device):
    """The GPU number of ``"cuda:N"`` (``"cuda"``: 0), or of an int."""
    if isinstance(device, str):
        return int(device.split(":")[1]) if ":" in device else 0
    return int(device)


def use_device(device):
    """Make ``device`` (``"cuda:N"`` or N) the calling thread's current device,
    until changed again.  The estimators use :func:`device_scope` instead;
    this is for code outside a fit (the benchmarks' hook)."""
    cp.cuda.Device(device_index(device)).use()


#: cudaErrorMemoryAllocation
_CUDA_ERROR_MEMORY_ALLOCATION = 2


def _out_of_memory(exc):
    """Where ``exc`` ran out of memory: "device" (cupy's out-of-memory error,
    a CUDA allocation error, a CUDA library's ``*_STATUS_ALLOC_FAILED``),
    "host" (another ``MemoryError``: numpy's, or pinned memory), or None."""
    if isinstance(exc, _memory.InsufficientMemoryError):
        return None
    if isinstance(exc, cp.cuda.memory.OutOfMemoryError):
        return "device"
    if isinstance(exc, cp.cuda.runtime.CUDARuntimeError):
        return "device" if getattr(exc, "status", None) == _CUDA_ERROR_MEMORY_ALLOCATION else None
    if isinstance(exc, MemoryError):
        return "host"
    if "STATUS_ALLOC_FAILED" in str(exc):  # cuSPARSE, cuBLAS
        return "device"
    return None


def release_pools(device=None):
    """Give the memory pools' unused blocks (those of GPU ``device``,
    default the current one, and the pinned host pool) back."""
    with cp.cuda.Device(None if device is None else device_index(device)):
        cp.get_default_memory_pool().free_all_blocks()
    cp.get_default_pinned_memory_pool().free_all_blocks()


def release_cached():
    """The current device's pool's unused blocks given back (between a
    fit's phases).  Why: the blocks a phase freed are still held, and the
    next phase's sizes need not fit in them, so the device would hold both
    (against a ``device_memory_limit`` too)."""
    cp.get_default_memory_pool().free_all_blocks()


_NO_CUB = {"depth": 0, "saved": None}
_NO_CUB_LOCK = threading.Lock()


@contextmanager
def plain_reductions():
    """CuPy's reductions without its CUB accelerator while any fit or
    prediction runs (a count of the scopes open, in every thread; the
    setting is CuPy's, process-wide: the one before the first scope is
    restored when the last one ends, and a change made meanwhile, in any
    thread, is undone then; other threads' reductions run without CUB
    meanwhile, as fast, only compiled differently).

    Rule: the package's reductions (``all``, ``any``, ``sum`` of arrays of
    every nonzero) use CuPy's own reduction kernels.  Why: CuPy compiles a
    CUB reduction at its first use, two kernels of 1.5-2.5 s each on a cold
    cache for every operation and dtype, where its own compiles in about
    0.1 s.  Both read the array once; CuPy's own ``all`` and ``any`` of a
    large array to one value are slow, and go through :mod:`._reduce` (rows
    first)."""
    acc = getattr(cp._core, "_accelerator", cp._core)
    get = getattr(acc, "get_reduction_accelerators", None)
    put = getattr(acc, "set_reduction_accelerators", None)
    if get is None or put is None:  # another CuPy: nothing to do
        yield
        return
    with _NO_CUB_LOCK:
        if _NO_CUB["depth"] == 0:
            _NO_CUB["saved"] = list(get())
            put([])
        _NO_CUB["depth"] += 1
    try:
        yield
    finally:
        with _NO_CUB_LOCK:
            _NO_CUB["depth"] -= 1
            if _NO_CUB["depth"] == 0:
                put(_NO_CUB["saved"])


@contextmanager
def device_scope(device):
    """The scope of one fit or prediction on GPU ``device`` (``"cuda:N"``).

    Inside, the GPU is the calling thread's current device (cupy's current
    device is per thread; the previous one comes back after), so that fits on
    different GPUs in different threads never see each other's.  Running out
    of memory inside (see :func:`_out_of_memory`) leaves as
    :class:`~sklearn_cuwide._memory.InsufficientMemoryError`, chained to
    the original error, after the arrays of the work's finished frames are
    dropped.  The error carries the release of this device's pools, which
    the estimator method takes once its own frame, which still holds arrays
    here, has ended (:func:`sklearn_cuwide._base.releases_memory`): the fit's
    device memory is free again when the caller sees the error.  CuPy's
    reductions run without CUB inside (:func:`plain_reductions`).
    """
    with cp.cuda.Device(device_index(device)), plain_reductions():
        try:
            yield
        except BaseException as exc:
            where = _out_of_memory(exc)
            if where is None:
                raise
            _memory.release_frames(exc)
            err = _memory.out_of_memory_error(exc, where)
            err._release = functools.partial(release_pools, device)
            raise err from exc


_PROPS = {}


def props():
    """The current device's properties, read once per device (the call is slow)."""
    dev = cp.cuda.runtime.getDevice()
    p = _PROPS.get(dev)
    if p is None:
        p = _PROPS[dev] = cp.cuda.runtime.getDeviceProperties(dev)
    return p


def tile_shape(params, n_outputs, n_factors, batch_size, workers=None):
    """Sample-block rows and most hot features, from this device's shared
    memory, for an epoch of ``workers`` (1: in order; None: not known, as
    for concurrent workers)."""
    per_sm = props()["sharedMemPerMultiprocessor"]
    return _tiles.tile_shape(per_sm, params, n_outputs, n_factors, batch_size,
                             in_order=workers == 1)


def full_grid():
    """Thread blocks of the training kernel that run at once on the device
    (the most workers)."""
    return props()["multiProcessorCount"] * _tiles.BLOCKS_PER_SM


def cluster_sizes():
    """Thread blocks per worker this device can run: clusters need compute
    capability 9.0 (Hopper) or later; before, one block per worker."""
    return _concurrency.CLUSTER_SIZES if props()["major"] >= 9 else (1,)


def cluster_for(workers):
    """Thread blocks per worker for ``workers`` concurrent workers on this
    device (:func:`sklearn_cuwide._backends._concurrency.cluster_for`)."""
    return _concurrency.cluster_for(workers, full_grid(), cluster_sizes())


def default_grid(n_batches):
    """Workers an epoch of ``n_batches`` mini-batches runs on when none are
    asked for (:func:`sklearn_cuwide._backends._concurrency.grid_for`)."""
    return _concurrency.grid_for(n_batches, full_grid())


def concurrent_blocks(concurrency, params, n_batches):
    """Workers (concurrent mini-batches) for the estimators' ``concurrency``
    ("auto", "max" or an int): see :mod:`sklearn_cuwide._backends._concurrency`;
    each worker gets :func:`cluster_for` blocks."""
    return _concurrency.blocks(concurrency, params.model, params.solver, n_batches,
                               full_grid())


def free_memory():
    """Bytes the device has free (cupy's pool included)."""
    return device_memory()[0]


def device_memory():
    """``(free, total)`` bytes of the current device.  Free counts the
    memory pool's unused blocks, and stays within the pool's limit when one
    is set (``cupy.get_default_memory_pool().set_limit``)."""
    free, total = cp.cuda.runtime.memGetInfo()
    pool = cp.get_default_memory_pool()
    free = int(free) + int(pool.free_bytes())
    limit = int(pool.get_limit())
    if limit:
        free = min(free, max(0, limit - int(pool.used_bytes())))
    return free, int(total)


# --------------------------------------------------------------------------
# data movement
# --------------------------------------------------------------------------
def holds(X):
    """True for a cupy array or a cupyx sparse matrix: it is validated and
    used where it is, never copied to the host."""
    return isinstance(X, cp.ndarray) or bool(cpsp.issparse(X))


def to_device(a):
    return cp.asarray(a)


def to_host(a, out=None):
    if out is not None:  # straight into the caller's memory (page-locked: at full rate)
        if isinstance(a, cp.ndarray):
            a.get(out=out)
        else:
            out[...] = a
        return out
    if isinstance(a, cp.ndarray):
        return cp.asnumpy(a)
    return np.asarray(a)


def all_finite(a):
    """Whether every value of device array ``a`` is finite (a large one in
    two passes: :mod:`._reduce`)."""
    return _reduce.all_finite(cp, a)


def holds_zero(a):
    """Whether device array ``a`` holds a value equal to 0 (a large one in
    two passes: :mod:`._reduce`; CuPy's one-pass count of the 156M values
    of a 4M-row CSR took 0.11 s in a fit)."""
    return bool(_reduce.reduce_all(cp, a == 0, "any"))


def synchronize():
    cp.cuda.get_current_stream().synchronize()


#: a host matrix of at least this many nonzeros crosses through the pinned
#: double buffer (:func:`._upload.upload_csr`); a smaller one in one copy
PINNED_UPLOAD_NNZ = 1 << 22


def put_csr(X, dtype=None):
    """A canonical cupyx CSR matrix on the device (no host round trip for cupy input)."""
    if isinstance(X, cp.ndarray):
        X = cpsp.csr_matrix(X)
    elif not cpsp.issparse(X):
        X = canonical_csr(X)  # canonical on the host, then copied
        check_index_width(X)  # an older cupy would cast its indices to int32
        if X.nnz >= PINNED_UPLOAD_NNZ:  # pageable copies run at a fraction of pinned ones
            arrays = _upload.upload_csr(X, cp)
        else:
            arrays = (cp.asarray(X.indptr), cp.asarray(X.indices), cp.asarray(X.data))
        # canonical on the host: said so, not checked again by a device pass
        X = csr_of_arrays(*arrays, X.shape)
    return canonical_csr(X, dtype)


def csr_of_arrays(indptr, indices, data, shape):
    """A cupyx CSR of device arrays that hold rows of a canonical matrix
    (``indptr`` of any integer dtype), flagged canonical as they are."""
    out = cpsp.csr_matrix((data, indices, indptr.astype(indices.dtype, copy=False)),
                          shape=shape)
    out.has_canonical_format = True
    return out


def csr_in_layout_order(X, feature_order, feature_rank):
    """``X[:, feature_order]`` of a canonical cupyx CSR ``X``: each column
    index ``j`` renamed ``feature_rank[j]`` in place of the column gather,
    the rows left in their order, so that no sort runs (nor CuPy's kernels
    for it compile).  Rule: only the prediction kernel reads the result; it
    sums a row's entries in any order, and the rows stay duplicate-free.
    The matrix is flagged canonical for ``put_csr`` to take it as it is:
    scipy-style operations that need sorted rows must not get it."""
    rank = cp.asarray(feature_rank).astype(X.indices.dtype, copy=False)
    out = cpsp.csr_matrix((X.data, rank[X.indices], X.indptr), shape=X.shape)
    out.has_canonical_format = True
    return out


@dataclass
class DeviceState(ModelState):
    """A model state on the device, with the CUDA backend's bookkeeping of
    it: ``packed``, the buffer that holds Adagrad's sums of the linear
    weights beside the layout's penalty factors, and the token of the
    factors it holds (see :func:`._train.pack_penalty`), or None."""

    packed: dict = None


def put_state(state):
    out = DeviceState(w=None, b=None)
    for k, a in state.arrays().items():
        setattr(out, k, cp.ascontiguousarray(cp.asarray(a)))
    return out


def get_state(state, lazy=()):
    """A device state as numpy, its large arrays through page-locked memory
    (:func:`._upload.download`); the arrays named in ``lazy`` stay on the
    device as :class:`DeviceArray`, read back when the host first needs them."""
    out = ModelState(w=None, b=None)
    for k, a in state.arrays().items():
        if not isinstance(a, cp.ndarray):
            a = np.asarray(a)
        elif k in lazy:
            a = DeviceArray(a)
        else:
            a = _upload.download(cp, a)
        setattr(out, k, a)
    return out


class DeviceArray:
    """A device array that stands for a numpy array until the host reads it.

    Rule: numpy conversion (``np.asarray``, ``np.array``) and pickling read it
    back once (the device copy is then dropped) and give a plain numpy array,
    so an estimator holding one pickles as if it held numpy and loads where
    no GPU is.  Why: a fit's Adagrad sums are read only to continue or pickle
    the model, and their copy would otherwise lengthen every fit.
    """

    __slots__ = ("_device", "_host")

    def __init__(self, a):
        self._device, self._host = a, None

    @property
    def shape(self):
        return (self._host if self._device is None else self._device).shape

    @property
    def dtype(self):
        return (self._host if self._device is None else self._device).dtype

    @property
    def nbytes(self):
        """Bytes held on the device (0 once read back)."""
        return 0 if self._device is None else int(self._device.nbytes)

    def get(self):
        """The numpy array (read back on the first call)."""
        if self._device is not None:
            with self._device.device:
                self._host = _upload.download(cp, self._device)
            self._device = None
        return self._host

    def __array__(self, dtype=None, copy=None):
        a = self.get()
        if dtype is not None and np.dtype(dtype) != a.dtype:
            return a.astype(dtype)
        return a.copy() if copy else a

    def __reduce__(self):
        return self.get().__reduce__()
