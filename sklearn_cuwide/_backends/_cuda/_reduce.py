"""``all`` and ``any`` of large device arrays, in two passes.

Rule: ``all`` and ``any`` of an array of :data:`TWO_PASS_ITEMS` items or
more reduce rows of it first (:data:`ROWS` of them, each by a thread block
of its own), then those values.  Why: the fits run CuPy's reductions without
CUB (``_runtime.plain_reductions``), and CuPy's own ``all`` / ``any`` of a
large bool array to one value keeps few multiprocessors busy, a hundred
times slower than rows first (its ``max``, ``min`` and ``sum`` are not: they
stay one pass).  Smaller arrays keep the one pass.  The threshold is the
device checks' (``_base.DEVICE_SCAN_MIN_NNZ``): the finiteness of a
prediction's 19.5M uploaded values took 10 ms in one pass (a 500,000-row
prediction 25.8 ms against 15.4 ms with the checks on the host); the
kernel over rows is compiled ahead with CuPy's others
(:mod:`._warmup`; docs/design/host_passes.rst has the measurements).

Rule: this module takes the array module as ``xp`` (cupy) and imports no
cupy.  Why: the CPU tests check it against numpy's reductions.
"""

__all__ = ["TWO_PASS_ITEMS", "ROWS", "reduce_all", "all_finite"]

#: arrays of at least this many items are reduced in two passes
TWO_PASS_ITEMS = 1 << 22
#: the first pass's rows
ROWS = 1024


def reduce_all(xp, a, op):
    """``getattr(a, op)()`` over every item of array ``a`` (``op``: ``"all"``
    or ``"any"``, where it pays; ``"max"``, ``"min"`` and ``"sum"`` give the
    same too, the rows' partial sums added in the array's accumulation
    dtype), as a 0-d array of ``xp``."""
    flat = a.ravel()
    n = flat.size
    if n < TWO_PASS_ITEMS:
        return getattr(flat, op)()
    width = n // ROWS
    body = ROWS * width
    part = getattr(flat[:body].reshape(ROWS, width), op)(axis=1)
    if body < n:  # the last items, fewer than a row
        tail = getattr(flat[body:], op)().reshape(1)
        part = xp.concatenate([part, tail.astype(part.dtype, copy=False)])
    return getattr(part, op)()


def all_finite(xp, a):
    """Whether every value of device array ``a`` is finite (one sync)."""
    return bool(reduce_all(xp, xp.isfinite(a), "all"))
