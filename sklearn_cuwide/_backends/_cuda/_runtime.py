"""The CUDA backend's device: which GPU, its properties, and moving arrays,
matrices and model states between the host and it."""

from dataclasses import dataclass

import cupy as cp
import cupyx.scipy.sparse as cpsp
import numpy as np

from ..._sparse import canonical_csr
from ..._state import ModelState
from .. import _concurrency, _tiles
from ._validate import check_index_width

#: a null device pointer, for the kernels' optional arrays
NULL = np.uint64(0)
#: the C type of a dtype, for the kernels' template arguments
CTYPE = {
    np.dtype(np.int32): "int",
    np.dtype(np.int64): "long long",
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
}


def use_device(i):
    """Make GPU ``i`` cupy's current device (of the calling thread)."""
    cp.cuda.Device(int(i)).use()


_PROPS = {}


def props():
    """The current device's properties, read once per device (the call is slow)."""
    dev = cp.cuda.runtime.getDevice()
    p = _PROPS.get(dev)
    if p is None:
        p = _PROPS[dev] = cp.cuda.runtime.getDeviceProperties(dev)
    return p


def tile_shape(params, n_outputs, n_factors, batch_size):
    """Sample-block rows and most hot features, from this device's shared memory."""
    per_sm = props()["sharedMemPerMultiprocessor"]
    return _tiles.tile_shape(per_sm, params, n_outputs, n_factors, batch_size)


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
    free, _ = cp.cuda.runtime.memGetInfo()
    pool = cp.get_default_memory_pool()
    return int(free + pool.free_bytes())


# --------------------------------------------------------------------------
# data movement
# --------------------------------------------------------------------------
def holds(X):
    """True for a cupy array or a cupyx sparse matrix: it is validated and
    used where it is, never copied to the host."""
    return isinstance(X, cp.ndarray) or bool(cpsp.issparse(X))


def to_device(a):
    return cp.asarray(a)


def to_host(a):
    if isinstance(a, cp.ndarray):
        return cp.asnumpy(a)
    return np.asarray(a)


def synchronize():
    cp.cuda.get_current_stream().synchronize()


def put_csr(X, dtype=None):
    """A canonical cupyx CSR matrix on the device (no host round trip for cupy input)."""
    if isinstance(X, cp.ndarray):
        X = cpsp.csr_matrix(X)
    elif not cpsp.issparse(X):
        X = canonical_csr(X)  # canonical on the host, then copied
        check_index_width(X)  # an older cupy would cast its indices to int32
        X = cpsp.csr_matrix(X)
    return canonical_csr(X, dtype)


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


def get_state(state):
    out = ModelState(w=None, b=None)
    for k, a in state.arrays().items():
        setattr(out, k, cp.asnumpy(a))
    return out
