"""The initial factors drawn on the device (``cuda/cuwide_factors.cu``):
:func:`sklearn_cuwide._state.draw_factors` in one kernel."""

import math

import cupy as cp
import numpy as np

from ... import _state
from ..._kernels import factors_instantiation, get_kernel

__all__ = ["draw_factors"]

_THREADS = 256
_MAX_BLOCKS = 1 << 16
_TABLES = {}  # device -> the quantile table there


def draw_factors(seed, scale, features, n_factors, dtype=np.float32):
    """``draw_factors(cupy, seed, scale, features, n_factors, dtype)``'s bits
    (``features``: the user ids of the rows, a device int64 array), one
    kernel and no temporaries."""
    n, k = int(features.shape[0]), int(n_factors)
    V = cp.empty((n, k), dtype=dtype)
    if n == 0 or k == 0:
        return V
    dev = cp.cuda.runtime.getDevice()
    if dev not in _TABLES:
        _TABLES[dev] = cp.asarray(_state.quantile_table())
    features = cp.ascontiguousarray(features, dtype=cp.int64)
    kern = get_kernel("cuwide_factors.cu", factors_instantiation(np.dtype(dtype).name))
    blocks = max(1, min(math.ceil(n * k / _THREADS), _MAX_BLOCKS))
    kern((blocks,), (_THREADS,),
         (features, np.int64(n), np.int32(k), np.uint64(_state.seed_mix(seed)),
          _TABLES[dev], np.float64(scale), V))
    return V
