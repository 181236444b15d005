"""Full reductions of large device arrays, in two passes.

Rule: a reduction of a large array to one value first reduces rows of it
(:data:`ROWS` of them, each by a thread block of its own), then those
values.  Why: the fits run CuPy's reductions without CUB
(``_runtime._plain_reductions``), and CuPy's own kernel reduces to one value
in a single thread block: 48 ms for the finiteness of 64M factors on an H200,
where a reduction of rows first keeps every multiprocessor busy.  Arrays
below :data:`TWO_PASS_ITEMS` (a single pass of at most about 25 ms) keep the
single pass: the kernel of a reduction over rows is one more CuPy
compilation (about 0.1 s) on a cold cache, which the models of a fresh
process's usual first fits (the start-up benchmark's 2^20 features times 16
factors among them) do not pay.

Rule: this module takes the array module as ``xp`` (cupy) and imports no
cupy.  Why: the CPU tests check it against numpy's reductions.
"""

__all__ = ["TWO_PASS_ITEMS", "ROWS", "reduce_all", "all_finite"]

#: arrays of at least this many items are reduced in two passes
TWO_PASS_ITEMS = 1 << 25
#: the first pass's rows
ROWS = 1024


def reduce_all(xp, a, op):
    """``getattr(a, op)()`` over every item of array ``a`` (``op``: ``"all"``,
    ``"any"``, ``"max"``, ``"min"`` or ``"sum"``, whose rows' partial sums
    are added in the array's accumulation dtype), as a 0-d array of ``xp``."""
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
