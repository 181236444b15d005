"""The structure check of sparse input, and its error messages.

scipy and cupyx check little of a sparse matrix's structure when it is
built (scipy checks the indices of a matrix given as ``(data, indices,
indptr)`` only in ``check_format(full_check=True)``) and nothing when its
arrays are replaced afterwards, as a feature hasher declared with the wrong
width or a hand-built matrix can leave them.  The kernels, scipy's own
conversions and this package's layout trust the structure: a column index
outside ``[0, n_features)`` is read out of bounds (garbage or a crash), a
decreasing ``indptr`` is an internal error far from its cause.

:func:`check_sparse_structure` is the one check, done once on a fit's or a
prediction's input before anything reads it: on the host with numpy, and on
the GPU with cupy for cupy input (:mod:`sklearn_cuwide._backends._cuda._validate`
calls it with ``xp=cupy``), where it costs one transfer of four numbers.
The messages are written here only, so both backends say the same words.

What it checks, for CSR and CSC (``major``: rows of CSR, columns of CSC):

* the index arrays are 1-D arrays of integers;
* ``indptr`` has ``n_major + 1`` entries, starts at 0, never decreases and
  ends at ``len(indices) == len(data)``;
* every index is in ``[0, n_minor)``;

and for COO: ``row``, ``col`` and ``data`` have one length, every row in
``[0, n_samples)`` and every column in ``[0, n_features)``.

Its cost: one reduction over the indices (the maximum of their bits read as
unsigned integers: a negative index is then a huge one, so one comparison
finds both), and one comparison of ``indptr`` with itself shifted by one;
nothing per row in Python.  On a 4M-row CSR matrix of 156M nonzeros and
2**22 features (``make_ctr_classification``), about 58 ms on one CPU core:
less than scikit-learn's finiteness check of its values, or scipy's
``has_canonical_format``.  The offending position is looked for only when
the check fails.  Unsorted indices and duplicates are valid:
:func:`sklearn_cuwide._sparse.canonical_csr` makes them canonical
afterwards, in a copy.

On the host, a pass over a large array (this reduction, and
:func:`surely_finite` before scikit-learn's finiteness check) runs in
pieces on up to :data:`HOST_THREADS` threads: numpy releases the GIL while
it reduces, and these passes read every nonzero of the user's data.  A GPU
fit of a large host CSR matrix makes both on the copy it uploads instead
(``index_range=False`` here; :class:`sklearn_cuwide._base.DeferredScans`).
"""

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def usable_cores():
    """The CPU cores this process may run on (its affinity where the system
    tells it, else the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


#: threads of a host pass over a large array (more shorten the scans and
#: slow the upload's pinned fills: docs/design/host_passes.rst)
HOST_THREADS = min(8, usable_cores())
#: arrays of fewer items take one pass on the calling thread (a piece
#: handed to a thread costs tens of microseconds)
PARALLEL_MIN_ITEMS = 1 << 22

_pool = None
_pool_lock = threading.Lock()


def host_pool():
    """The process's pool of :data:`HOST_THREADS` threads for host passes
    over large arrays (these checks, the upload's pinned fills), made once
    (again in a forked child)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=HOST_THREADS,
                                       thread_name_prefix="cuwide-host")
        return _pool


def _forget_pool_in_child():
    # a forked child inherits the pool but not its threads: a new one there
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)


def host_reduce(func, a, combine):
    """``combine([func(piece), ...])`` over contiguous pieces of the 1-D
    numpy array ``a`` (``func`` a reduction that ``combine`` can merge:
    ``max`` of maxima, ``all`` of booleans), on :data:`HOST_THREADS`
    threads when ``a`` has at least :data:`PARALLEL_MIN_ITEMS` items."""
    n = int(a.shape[0])
    k = HOST_THREADS if n >= PARALLEL_MIN_ITEMS else 1
    if k == 1:
        return combine([func(a)])
    cuts = [n * i // k for i in range(k + 1)]
    return combine(list(host_pool().map(func, [a[i:j] for i, j in zip(cuts[:-1], cuts[1:])])))


def _flat_values(X):
    """The values of ``X`` (a scipy sparse matrix's ``data``, or a numpy
    array) as one contiguous float32 or float64 array, or None.  A
    Fortran-ordered array is read in its memory order (a view); another
    layout is copied (the range check must see every value)."""
    a = getattr(X, "data", X) if hasattr(X, "format") else X
    if not isinstance(a, np.ndarray) or a.dtype not in (np.float32, np.float64):
        return None
    return a.ravel(order="K")


def scan_values(X):
    """``(finite, top)`` of the values of ``X`` in one pass over them:
    ``finite`` as :func:`surely_finite`; ``top`` the largest magnitude of
    float64 values (None for float32, which float32 holds, and for input
    not scanned).  A float64 value beyond float32's range is found by the
    same pass that finds a NaN or an infinity."""
    a = _flat_values(X)
    if a is None:
        return False, None
    if a.dtype == np.float64:
        top = _top(a)
        return bool(np.isfinite(top)), top
    return bool(host_reduce(_finite_sum, a, all)), None


def surely_finite(X):
    """True when every value of ``X`` (a scipy sparse matrix's ``data``, or a
    numpy array) is finite: float64 by its largest magnitude, float32 by the
    sum of each piece (a NaN or an infinity makes it non-finite); False when
    that is not sure (a non-finite value, a sum that overflows, another
    type): scikit-learn's own check then decides and words the error."""
    return scan_values(X)[0]


#: the largest float32: what the model is computed in
F32_MAX = float(np.finfo(np.float32).max)
#: values of a piece whose magnitudes are taken at a time (a temporary that
#: stays in cache: the pass reads the data once)
_MAGNITUDE_BLOCK = 1 << 16


def largest_beyond_float32(X):
    """The largest magnitude among the values of a float64 ``X`` (a scipy
    sparse matrix's ``data``, or a numpy array) when it is beyond float32's
    range, else None (float32 and other dtypes are within it: not scanned)."""
    a = _flat_values(X)
    if a is None or a.dtype != np.float64:
        return None
    top = _top(a)
    return top if top > F32_MAX else None


def _top(a):
    """The largest ``|a|`` of a flat float64 array (NaN when it holds one),
    on the host's threads; 0 when empty."""
    return host_reduce(_largest_magnitude, a, _nan_max) if a.size else 0.0


def _largest_magnitude(a):
    """The largest ``|a|`` (NaN when ``a`` holds one)."""
    top = 0.0
    for i in range(0, a.shape[0], _MAGNITUDE_BLOCK):
        m = float(np.abs(a[i : i + _MAGNITUDE_BLOCK]).max())
        if m != m:  # NaN
            return m
        top = max(top, m)
    return top


def _nan_max(values):
    values = list(values)
    return next((v for v in values if v != v), max(values))


def check_float32_range(X, what="X", top=None):
    """Refuse values beyond float32's range, in which the model is computed
    (they would become infinities and the model or its predictions NaN).
    ``top``: the largest magnitude :func:`scan_values` found already (else
    the values are scanned here)."""
    if top is None:
        top = largest_beyond_float32(X)
    if top is not None and top > F32_MAX:
        raise ValueError(float32_range_message(top, what))


def float32_range_message(top, what="X"):
    """The error for a value of magnitude ``top`` beyond float32's range in
    ``what`` ("X" or "y"), for both backends."""
    if what == "X":
        advice = ("Scale the features (e.g. with sklearn.preprocessing.MaxAbsScaler, "
                  "which keeps sparse data sparse).")
    else:
        advice = "Rescale y (e.g. divide it by a constant, and the predictions back)."
    return (f"Input {what} contains a value of magnitude {top:.3g}, beyond the range of "
            f"float32 (up to {F32_MAX:.3g}), in which the model is computed. {advice}")


def holds_zero(a):
    """Whether the 1-D array ``a`` holds a value equal to 0, compared a
    cached block at a time (a piece for :func:`host_reduce` with ``any``:
    ``np.count_nonzero`` holds the GIL, the comparison does not)."""
    flags = np.empty(min(int(a.shape[0]), _ZERO_BLOCK), dtype=bool)
    for i in range(0, a.shape[0], _ZERO_BLOCK):
        block = a[i : i + _ZERO_BLOCK]
        if np.equal(block, 0, out=flags[: block.shape[0]]).any():
            return True
    return False


#: values of a piece compared with 0 at a time (their flags stay in cache)
_ZERO_BLOCK = 1 << 18


def _finite_sum(a):
    # an overflowing sum of finite values, or inf - inf, is a "not sure", not
    # a warning (errstate is per thread: set here, in the piece's thread)
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(a.sum()))

__all__ = ["check_sparse_structure", "CHECKED_FORMATS", "index_width_message"]

#: the sparse formats whose structure is checked; others (LIL, DOK, DIA,
#: BSR) go to scipy's conversion to CSR unchecked (BSR's block indices are
#: the only ones of them a user can corrupt as easily)
CHECKED_FORMATS = ("csr", "csc", "coo")

_AXIS = ("row", "column")
_COUNT = ("n_samples", "n_features")


# --------------------------------------------------------------------------
# the messages (both backends)
# --------------------------------------------------------------------------
def _invalid(fmt, detail):
    return ValueError(f"Invalid {fmt.upper()} matrix X: {detail}")


def _index_out_of_range(fmt, shape, axis, attr, k, value, other):
    """An index of ``axis`` (0: a row index, 1: a column index), stored at
    ``attr[k]``, is ``value``; it belongs to the ``other`` axis's entry
    ``other`` (its row or column)."""
    name, count, n = _AXIS[axis], _COUNT[axis], shape[axis]
    return _invalid(
        fmt,
        f"{name} index {attr}[{k}] = {value} in {_AXIS[1 - axis]} {other} is "
        f"out of range; the {name} indices of a matrix of shape {shape} must be "
        f"in [0, {n}) (0 <= index < {count} = {n}). The matrix is corrupt, or "
        f"its shape has fewer {name}s than its indices need"
        + (" (a feature hasher's n_features, for instance)." if axis else "."),
    )


def _bad_index_array(fmt, attr, a):
    return _invalid(
        fmt,
        f"{attr} must be a 1-D array of integers; got an array of shape "
        f"{tuple(int(s) for s in a.shape)} and dtype {np.dtype(a.dtype)}.",
    )


def _bad_indptr_length(fmt, shape, major, length):
    n = shape[major]
    return _invalid(
        fmt,
        f"X.indptr has {length} entries, but a matrix of shape {shape} needs "
        f"{n + 1} (X.shape[{major}] + 1, one more than its {_AXIS[major]}s).",
    )


def _bad_indptr_start(fmt, first):
    return _invalid(fmt, f"X.indptr[0] = {first}, but X.indptr must start at 0.")


def _decreasing_indptr(fmt, major, i, a, b):
    name = _AXIS[major]
    return _invalid(
        fmt,
        f"X.indptr decreases at {name} {i}: X.indptr[{i}] = {a} > "
        f"X.indptr[{i + 1}] = {b}; X.indptr must be non-decreasing ({name} i "
        "holds the entries X.indptr[i]:X.indptr[i + 1]).",
    )


def _bad_indptr_end(fmt, last, n_indices):
    return _invalid(
        fmt,
        f"X.indptr[-1] = {last}, but X.indices has {n_indices} entries; "
        "X.indptr[-1] must be the number of stored entries, len(X.indices).",
    )


def _bad_lengths(fmt, names, lengths):
    if len(names) == 2:
        listed = f"{names[0]} has {lengths[0]} entries and {names[1]} has {lengths[1]}"
    else:
        counts = ", ".join(str(n) for n in lengths[:-1])
        listed = (f"{', '.join(names[:-1])} and {names[-1]} have {counts} and "
                  f"{lengths[-1]} entries")
    return _invalid(fmt, f"{listed}; they must have the same length.")


def index_width_message(nnz, n_features, cupy_version):
    """The message of a matrix too large for a cupy that copies sparse
    matrices to the GPU with int32 indices (cupy before 14.1)."""
    return (
        f"X has {nnz} stored entries and {n_features} features, but cupy "
        f"{cupy_version} copies a sparse matrix to the GPU with int32 indices, "
        f"which hold at most {2**31 - 1}: both must be below 2**31. Install "
        "cupy >= 14.1 (it keeps int64 indices), pass X in smaller row chunks "
        "(partial_fit, or predict on slices of rows), or use device='cpu'."
    )


# --------------------------------------------------------------------------
# the check
# --------------------------------------------------------------------------
def _is_index_array(a):
    return getattr(a, "ndim", None) == 1 and np.dtype(a.dtype).kind in "iu"


def _unsigned_bound(a, n):
    """``(a as unsigned, bound)``: the entries of the integer array ``a`` are
    in ``[0, n)`` exactly where ``a as unsigned < bound`` (None: always).

    Read as unsigned integers of its width, a negative entry becomes at
    least ``2**(bits - 1)``, above any valid entry of a signed array (they
    are below ``2**(bits - 1)``, hence the bound is clipped there), so one
    comparison finds both ways out.  A view, no copy.
    """
    dt = np.dtype(a.dtype)
    udt = np.dtype(f"u{dt.itemsize}")
    limit = np.iinfo(dt).max + 1
    bound = min(int(n), limit)
    if dt.kind == "u" and bound >= limit:
        return a, None  # unsigned, and the shape is wider than the dtype
    return a.view(udt), udt.type(bound)


def _exceeds(xp, a, n):
    """A 0-d boolean (on ``a``'s device), or None for False: some entry of
    the integer array ``a`` (not empty) is outside ``[0, n)``.  One reduction
    (a maximum), no temporary array."""
    u, bound = _unsigned_bound(a, n)
    if bound is None:
        return None
    if xp is np:
        return host_reduce(np.max, u, max) >= bound
    return xp.max(u) >= bound


def _outside(a, n):
    """The boolean array of ``a``'s entries outside ``[0, n)`` (the error
    path only)."""
    u, bound = _unsigned_bound(a, n)
    return u >= bound if bound is not None else u < 0


def _fetch(xp, values):
    """Python ints of a list of 0-d arrays / numbers (one transfer on a GPU)."""
    arrays = [v for v in values if not isinstance(v, (int, bool, type(None)))]
    if arrays:
        got = iter(xp.stack([xp.asarray(v).astype(xp.int64) for v in arrays]).tolist())
    out = []
    for v in values:
        if v is None or isinstance(v, (int, bool)):
            out.append(None if v is None else int(v))
        else:
            out.append(int(next(got)))
    return out


def check_sparse_structure(X, xp=np, index_range=True):
    """Raise a ``ValueError`` naming the first corruption of a sparse ``X``.

    ``X``: anything; only 2-D sparse matrices (or arrays) of the formats in
    :data:`CHECKED_FORMATS` are checked (scipy's with ``xp=numpy``,
    cupyx's with ``xp=cupy``), others pass.  Nothing is modified.

    Parameters
    ----------
    X : object
    xp : module
        numpy, or cupy for a cupyx matrix (the check then runs on its GPU).
    index_range : bool
        Whether a CSR or CSC matrix's indices are checked against their
        range here (the one pass over its nonzeros).  False: the caller
        checks them before anything reads them
        (:class:`sklearn_cuwide._base.DeferredScans`).
    """
    fmt = getattr(X, "format", None)
    if fmt not in CHECKED_FORMATS or len(getattr(X, "shape", ())) != 2:
        return
    shape = tuple(int(s) for s in X.shape)
    if fmt == "coo":
        _check_coo(X, shape, xp)
    else:
        _check_compressed(X, fmt, shape, xp, index_range)


def indices_out_of_range(xp, indices, n):
    """Whether some entry of the integer array ``indices`` (of ``xp``) is
    outside ``[0, n)``: the range check's one reduction, as a bool."""
    if int(indices.shape[0]) == 0:
        return False
    out = _exceeds(xp, indices, n)
    return False if out is None else bool(out)


def _check_compressed(X, fmt, shape, xp, index_range=True):
    major = 0 if fmt == "csr" else 1
    n_major, n_minor = shape[major], shape[1 - major]
    indptr, indices, data = X.indptr, X.indices, X.data
    for attr, a in (("X.indptr", indptr), ("X.indices", indices)):
        if not _is_index_array(a):
            raise _bad_index_array(fmt, attr, a)
    if int(indptr.shape[0]) != n_major + 1:
        raise _bad_indptr_length(fmt, shape, major, int(indptr.shape[0]))
    nnz = int(indices.shape[0])
    n_data = int(data.shape[0]) if getattr(data, "ndim", 0) == 1 else -1
    # one pass each over indptr and indices; one transfer on a GPU
    decreasing = xp.any(indptr[1:] < indptr[:-1]) if n_major > 0 else False
    out_of_range = _exceeds(xp, indices, n_minor) if nnz > 0 and index_range else False
    first, last, decreasing, out_of_range = _fetch(
        xp, [indptr[0], indptr[-1], decreasing, out_of_range])
    if first != 0:
        raise _bad_indptr_start(fmt, first)
    if decreasing:
        i = int(xp.argmax(indptr[1:] < indptr[:-1]))
        a, b = _fetch(xp, [indptr[i], indptr[i + 1]])
        raise _decreasing_indptr(fmt, major, i, a, b)
    if last != nnz:
        raise _bad_indptr_end(fmt, last, nnz)
    if n_data != nnz:
        if n_data < 0:
            raise _bad_index_array(fmt, "X.data", data)  # (not 1-D)
        raise _bad_lengths(fmt, ("X.indices", "X.data"), (nnz, n_data))
    if out_of_range:
        k = int(xp.argmax(_outside(indices, n_minor)))
        # the row (CSR) or column (CSC) holding entry k: indptr is valid now
        value, owner = _fetch(xp, [indices[k], xp.count_nonzero(indptr[1:] <= k)])
        raise _index_out_of_range(fmt, shape, 1 - major, "X.indices", k, value, owner)


def _check_coo(X, shape, xp):
    row, col, data = X.row, X.col, X.data
    for attr, a in (("X.row", row), ("X.col", col)):
        if not _is_index_array(a):
            raise _bad_index_array("coo", attr, a)
    if getattr(data, "ndim", 0) != 1:
        raise _bad_index_array("coo", "X.data", data)
    lengths = tuple(int(a.shape[0]) for a in (row, col, data))
    if len(set(lengths)) != 1:
        raise _bad_lengths("coo", ("X.row", "X.col", "X.data"), lengths)
    if lengths[0] == 0:
        return
    bad_row, bad_col = _fetch(xp, [_exceeds(xp, row, shape[0]),
                                   _exceeds(xp, col, shape[1])])
    if bad_row or bad_col:
        k = int(xp.argmax(_outside(row, shape[0]) | _outside(col, shape[1])))
        r, c = _fetch(xp, [row[k], col[k]])
        if not 0 <= r < shape[0]:
            raise _index_out_of_range("coo", shape, 0, "X.row", k, r, c)
        raise _index_out_of_range("coo", shape, 1, "X.col", k, c, r)
