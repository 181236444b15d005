"""CuPy's own kernels that a mini-batch fit runs, compiled ahead.

A process compiles each CuPy elementwise, scan or reduction signature the
first time it runs one (NVRTC, then CuPy's on-disk cache for later
processes). A cold mini-batch fit reaches about sixteen of them one after
another on its own thread, around 0.1 s each on the H200: the copies, the
gathers into the layout's order, the held-out rows' matrix, the best
epoch's copy of the state, the finiteness check (:doc:`/design/startup`).

Rule: when a fit starts, :func:`warm_up` runs those signatures once on
arrays of a few items, in :data:`THREADS` threads in the order the fit
reaches them, so that they compile beside the fit's host work instead of
in turn inside it.
Why: NVRTC releases the GIL. A signature this list misses (other dtypes,
solvers or paths) still compiles where the fit reaches it, as before; one
the fit reaches while its warm-up is still compiling it is compiled twice,
no slower than before. Each operation is the expression of the fit's code
named beside it, on tiny inputs of the fit's dtypes and ranks; a GPU test
checks that a cold fit compiles none of CuPy's kernels on its own thread
once its warm-up is done (``test_kernel_instantiation``).
"""

import threading
from concurrent.futures import ThreadPoolExecutor

import cupy as cp
import numpy as np

from . import _reduce, _runtime

#: threads that compile at once: CuPy's compilations run about ten a second
#: on the H200's host whatever the threads (20 at once took 1-2 s each), and
#: with four the first of the list, which the fit reaches first, are ready first
THREADS = 4
_DONE = set()  # (device, signature) warmed up in this process
_DONE_LOCK = threading.Lock()


def _ops(value, index, layout, n_outputs, n_factors, adagrad, packed):
    """The warm-up's operations, each a call without arguments that
    compiles one or two signatures (those the fit reaches first, first)."""
    f32, f64, i64 = cp.float32, cp.float64, cp.int64
    n, D, k = 8, int(n_outputs), int(n_factors)

    def rows():  # a state's rows in the user's feature order (feature_rank, uploaded)
        return cp.asarray(np.arange(n, dtype=np.int64))

    def sums():  # Adagrad's sums as _train.pack_penalty leaves them: a strided view
        return cp.zeros((n, D + 1), f32)[:, :D] if packed and adagrad else cp.zeros((n, D), f32)

    def pack():  # _train.pack_penalty
        base = cp.zeros((n, D + 1), f32)
        base[:, :D] = cp.zeros((n, D), f32)
        base[:, D] = cp.zeros(n, f32)

    ops = [
        lambda: cp.cumsum(cp.zeros(3, i64)),  # _build._row_places
        # the held-out rows' matrix (_runtime.csr_of_arrays) and its columns
        # renamed (_runtime.csr_in_layout_order)
        lambda: cp.zeros(2, i64).astype(index),
        lambda: _runtime.csr_of_arrays(cp.zeros(2, index), cp.zeros(1, index),
                                       cp.zeros(1, value), (1, 1)),
        lambda: cp.zeros(4, index)[cp.zeros(2, index)],
        # the targets and weights in the layout's order (_solvers.fit_minibatch)
        lambda: cp.zeros(4, layout)[cp.zeros(2, i64)],
        lambda: cp.zeros(4, f64)[cp.zeros(2, i64)],
        # the laid-out rows' sources in the row order (_layout.plan_csr), the
        # FM's rows' lengths (_minibatch.mean_row_nonzeros)
        lambda: cp.zeros(4, i64)[cp.zeros(2, i64)],
        lambda: cp.zeros(2, i64).astype(f64),
        lambda: cp.concatenate((cp.zeros(2, f64), cp.zeros(1, f64))),  # batch_weights
        lambda: cp.zeros(2, f64).astype(layout),
        lambda: cp.zeros(2, f32).astype(f64),  # _predict.decision_function's output
        # the state: packed, copied at the best epoch (_solvers._copy_state),
        # taken back to the user's order (ModelState.take_features), checked
        # (_reduce.all_finite)
        pack,
        lambda: cp.array(sums(), copy=True),
        lambda: cp.array(cp.zeros((n, D), f32), copy=True),
        lambda: cp.ascontiguousarray(cp.zeros((n, D), f32)[rows()]),
        lambda: cp.ascontiguousarray(sums()[rows()]),
        lambda: cp.isfinite(cp.zeros((n, D), f32)),
        lambda: _reduce.reduce_all(cp, cp.zeros(n, dtype=bool), "all"),
        lambda: cp.zeros((2, n), dtype=bool).all(axis=1),  # its rows, for a large model
    ]
    if k:
        ops.append(lambda: cp.ascontiguousarray(cp.zeros((n, k), f32)[rows()]))
    return ops


def _input_ops(value, index):
    """The operations of what reads a host matrix's staged copy before the
    layout's build (:func:`warm_up_input`), on its dtypes."""
    i64, f64, n = cp.int64, cp.float64, 8
    unsigned = np.dtype(f"u{np.dtype(index).itemsize}")

    def copy():  # _runtime.csr_of_arrays of the staged arrays
        return _runtime.csr_of_arrays(cp.zeros(n + 1, i64), cp.zeros(n, index),
                                      cp.zeros(n, value), (n, n))

    rows = lambda: cp.zeros(2, i64)  # noqa: E731 - the training or held-out rows
    ops = [
        copy,  # its index pointer's cast
        # _base.DeferredScans.on_device: the indices' range and the values
        lambda: cp.max(cp.zeros(n, index).view(unsigned)) >= unsigned.type(n),
        lambda: _reduce.all_finite(cp, cp.zeros(n, value)),
        # the stored zeros (_runtime.holds_zero) and the rows' entries
        # (_minibatch._stored, mean_row_nonzeros)
        lambda: _reduce.reduce_all(cp, cp.zeros(n, value) == 0, "any"),
        # the rows of both, first, for the nonzeros of a matrix the device checks
        lambda: cp.zeros((2, n), dtype=bool).all(axis=1),
        lambda: cp.zeros((2, n), dtype=bool).any(axis=1),
        lambda: (cp.zeros(n + 1, index)[rows() + 1] - cp.zeros(n + 1, index)[rows()]).sum(),
        lambda: cp.diff(cp.zeros(n + 1, index)).astype(i64)[rows()].astype(f64),
        lambda: float(cp.dot(cp.zeros(n, f64), cp.zeros(n, f64))),  # their weighted mean
    ]
    if np.dtype(value) == np.float64:  # the largest magnitude against float32's range
        ops.append(lambda: (float(cp.zeros(n, f64).max()), float(cp.zeros(n, f64).min())))
    return ops


def warm_up_input(value, index):
    """Start compiling, as :func:`warm_up` does, the CuPy kernels that read
    a host matrix's staged copy before the layout's build (the input's
    deferred checks, the step parameters' passes); ``value`` / ``index``
    the dtypes of its values and column indices.  Returns the thread, or
    None where this process warmed them up on this device already."""
    sig = ("input",) + tuple(np.dtype(d).str for d in (value, index))
    return _start(sig, _input_ops(np.dtype(value), np.dtype(index)))


def warm_up(value, index, layout, n_outputs, n_factors, adagrad, packed):
    """Start compiling, in background threads on the current device, the
    CuPy kernels a mini-batch fit runs: ``value`` / ``index`` the dtypes
    of the CSR's values and column indices on the device, ``layout`` the
    layout's value dtype, ``n_outputs`` / ``n_factors`` the model's shape,
    ``adagrad`` whether it keeps Adagrad's sums, ``packed`` whether they
    are packed with the penalty factors (penalties scaled). Returns at
    once: the warm-up's thread (None where this process warmed the
    signature up on this device already)."""
    sig = tuple(np.dtype(d).str for d in (value, index, layout)) + (
        int(n_outputs), int(n_factors), bool(adagrad), bool(packed))
    return _start(sig, _ops(np.dtype(value), np.dtype(index), np.dtype(layout), n_outputs,
                            n_factors, adagrad, packed))


def _start(sig, ops):
    """Run ``ops`` once per process and device for signature ``sig``, each
    in :data:`THREADS` threads; the thread that runs them, or None."""
    dev = cp.cuda.runtime.getDevice()
    with _DONE_LOCK:
        if (dev, sig) in _DONE:
            return None
        _DONE.add((dev, sig))

    def one(op):
        # the fit's reductions run without CUB: so are these compiled
        with cp.cuda.Device(dev), _runtime.plain_reductions():
            try:
                op()
            except Exception:  # noqa: BLE001 - the fit compiles it where it runs it
                pass

    def run():
        with ThreadPoolExecutor(min(THREADS, len(ops)), thread_name_prefix="cuwide-warmup") as pool:
            list(pool.map(one, ops))

    thread = threading.Thread(target=run, name="cuwide-warmup", daemon=True)
    thread.start()
    return thread
