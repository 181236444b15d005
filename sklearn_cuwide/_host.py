"""Passes over large host arrays, spread over the host's cores.

Rule: a pass over a whole model's rows on the host (a permutation between
the user's and the layout's feature order, the check for non-finite values,
a copy into page-locked memory) goes through these functions: an array of
at least :data:`PARALLEL_BYTES` is cut into contiguous runs of rows, one per
thread of the process's host pool (the one the input checks and the
upload's fills use), and numpy runs each run's loop without the GIL.  Why:
one numpy call runs on one core, and a model wider than the device is
several GB.
"""

import numpy as np
import scipy.sparse as sp
from scipy.special import expit, log_expit

from ._validation import HOST_THREADS, host_pool, host_reduce
from ._validation import holds_zero as _holds_zero

try:  # scipy's one-pass check behind ``has_canonical_format`` (private, stable for years)
    from scipy.sparse._sparsetools import csr_has_canonical_format as _csr_canonical
except ImportError:  # pragma: no cover - then the property itself, on one core
    _csr_canonical = None

__all__ = ["PARALLEL_BYTES", "run_count", "each_run", "row_runs", "each_of", "split_flags",
           "take_rows", "all_finite",
           "copy_rows", "csr_is_canonical", "binary_proba", "binary_log_proba",
           "EXPIT_PASS_BYTES"]

#: arrays smaller than this are one numpy call (threads cost more than they save)
PARALLEL_BYTES = 1 << 26
#: the bytes a pass of the logistic function counts per value: it costs
#: about what 32 passes over a float64 cost (a few nanoseconds a value), so
#: scores from about 260,000 rows take the host's threads
EXPIT_PASS_BYTES = 256


def _runs(n_rows, nbytes):
    """``[(start, stop)]``: the rows in one run per thread of the process's
    host pool (:func:`sklearn_cuwide._validation.host_pool`; one run for a
    small array)."""
    k = 1 if nbytes < PARALLEL_BYTES else min(HOST_THREADS, max(1, int(n_rows)))
    bounds = np.linspace(0, int(n_rows), k + 1).astype(np.int64).tolist()
    return list(zip(bounds[:-1], bounds[1:]))


def _each(fn, runs):
    """``fn(start, stop)`` for every run, on the host pool's threads when
    there are several (so never from a task of that pool: it would wait on
    itself)."""
    if len(runs) == 1:
        return [fn(*runs[0])]
    return list(host_pool().map(lambda r: fn(*r), runs))


def run_count(n_rows, nbytes):
    """How many runs (threads) a pass of ``nbytes`` over ``n_rows`` rows takes."""
    return len(_runs(n_rows, nbytes))


def each_run(n_rows, nbytes, fn):
    """``fn(start, stop)`` over runs covering ``n_rows`` rows (one per
    thread when ``nbytes``, what the pass touches, is large); their results
    in order.  ``fn`` must write disjoint rows."""
    return _each(fn, _runs(n_rows, nbytes))


def row_runs(n_rows, nbytes):
    """The runs (``[(start, stop)]``) :func:`each_run` cuts ``n_rows`` rows
    into for a pass over ``nbytes``: for several passes over the same runs
    (:func:`each_of`)."""
    return _runs(n_rows, nbytes)


def each_of(runs, fn, with_index=False):
    """``fn(start, stop)`` for each of ``runs`` (``fn(k, start, stop)``, ``k``
    the run's number, ``with_index``), on the host pool's threads when
    there are several; their results in order."""
    if not with_index:
        return _each(fn, runs)
    return _each(lambda k, ab: fn(k, *ab), list(enumerate(runs)))


def split_flags(flags, runs=None):
    """``(np.flatnonzero(~flags), np.flatnonzero(flags))`` of a bool array,
    int64, written run by run (``runs``: :func:`row_runs`'s, default for
    this array)."""
    n = int(flags.shape[0])
    runs = _runs(n, 17 * n) if runs is None else runs
    n_true = np.array(_each(lambda a, b: int(np.count_nonzero(flags[a:b])), runs),
                      dtype=np.int64)
    first_true = np.cumsum(n_true) - n_true
    yes = np.empty(int(n_true.sum()), dtype=np.int64)
    no = np.empty(n - yes.shape[0], dtype=np.int64)

    def write(k, a, b):
        f, t0 = flags[a:b], int(first_true[k])
        yes[t0:t0 + int(n_true[k])] = np.flatnonzero(f) + a
        f0 = a - t0
        no[f0:f0 + (b - a) - int(n_true[k])] = np.flatnonzero(~f) + a

    each_of(runs, write, with_index=True)
    return no, yes


def take_rows(a, index, out=None):
    """``a[index]`` along the first axis (``index``: integers, each in
    ``[-len(a), len(a))``), C-contiguous, written into ``out`` when given.
    Raises ``IndexError`` for an index out of range, before any row moves."""
    index = np.asarray(index)
    if index.size == 0:  # an empty list is float to numpy
        index = index.astype(np.intp)
    if index.dtype.kind not in "iu":
        raise TypeError(f"take_rows takes integer indices, not {index.dtype}")
    n = a.shape[0]
    if index.size and (int(index.min()) < -n or int(index.max()) >= n):
        raise IndexError(f"an index is out of range for {n} rows")
    if out is None:
        out = np.empty((index.shape[0],) + a.shape[1:], dtype=a.dtype)
    # in range (checked above): "wrap" takes as "raise" would, without the
    # copy "raise" makes of every run to undo it on an error
    _each(lambda s, e: np.take(a, index[s:e], axis=0, out=out[s:e], mode="wrap"),
          _runs(index.shape[0], out.nbytes))
    return out


def all_finite(a):
    """Whether every value of ``a`` is finite."""
    a = np.asarray(a)
    if a.ndim == 0:
        return bool(np.isfinite(a))
    return all(_each(lambda s, e: bool(np.isfinite(a[s:e]).all()),
                     _runs(a.shape[0], a.nbytes)))


def holds_zero(a):
    """Whether ``a`` holds a value equal to 0 (its pieces on every core)."""
    return host_reduce(_holds_zero, np.asarray(a).reshape(-1), any)


def fill_rows(a, value):
    """``a[...] = value``, the rows filled on every core; returns ``a``."""
    if a.ndim == 0:
        a[...] = value
        return a
    _each(lambda s, e: a[s:e].fill(value), _runs(a.shape[0], a.nbytes))
    return a


def copy_rows(dst, src):
    """``dst[...] = src`` (same shape; the two must not overlap: the runs
    are copied at once)."""
    if dst.shape != src.shape:
        raise ValueError(f"shapes differ: {dst.shape} and {src.shape}")
    if np.may_share_memory(dst, src):
        raise ValueError("copy_rows copies between arrays that do not overlap")
    if dst.ndim == 0:
        dst[...] = src
        return dst
    _each(lambda s, e: np.copyto(dst[s:e], src[s:e]), _runs(dst.shape[0], dst.nbytes))
    return dst


def csr_is_canonical(X):
    """``X.has_canonical_format`` of a CSR matrix (every row's indices
    strictly increasing).  For a scipy matrix whose flag scipy does not know
    yet, read over runs of rows on the host pool and remembered on ``X`` as
    scipy's property remembers it: rows are independent, so the runs'
    answers combine with ``and``; scipy's own pass is one core (6.3 s for
    5e9 nonzeros).  Any other matrix answers itself."""
    if (_csr_canonical is None or not sp.issparse(X) or hasattr(X, "_has_canonical_format")
            or not getattr(X, "_has_sorted_indices", True)):
        return bool(X.has_canonical_format)
    indptr, indices = X.indptr, X.indices

    def run(start, stop):
        ptr = indptr[start:stop + 1]
        lo, hi = int(ptr[0]), int(ptr[-1])
        return bool(_csr_canonical(stop - start, (ptr - lo).astype(indices.dtype, copy=False),
                                   indices[lo:hi]))

    ok = all(_each(run, _runs(X.shape[0], indices.nbytes)))
    X.has_canonical_format = ok
    return ok


def _binary(z, first, second):
    """``[first(z), second(z)]`` column by column into one new (n, 2)
    float64 array, over runs of rows on the host pool."""
    z = np.asarray(z, dtype=np.float64).reshape(-1)
    n = int(z.shape[0])
    out = np.empty((n, 2), dtype=np.float64)

    def run(start, stop):
        first(z[start:stop], out[start:stop])
        second(z[start:stop], out[start:stop])

    _each(run, _runs(n, EXPIT_PASS_BYTES * n))
    return out


def binary_proba(z):
    """``[1 - expit(z), expit(z)]`` (n, 2): the probabilities of a binary
    classifier's decision values ``z``, the second column computed first
    and the first from it, as ``np.column_stack([1 - p, p])`` would (the
    same numbers), in place, the rows' runs on the host's threads."""
    return _binary(z, lambda a, o: expit(a, out=o[:, 1]),
                   lambda a, o: np.subtract(1.0, o[:, 1], out=o[:, 0]))


def binary_log_proba(z):
    """``[log_expit(-z), log_expit(z)]`` (n, 2), as :func:`binary_proba`."""
    return _binary(z, lambda a, o: log_expit(-a, out=o[:, 0]),
                   lambda a, o: log_expit(a, out=o[:, 1]))
