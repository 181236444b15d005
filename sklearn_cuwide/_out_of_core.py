"""Models larger than the device: resident hot rows and a scratchpad of cold rows.

A model's parameters and optimiser state are rows, one per feature.  The
layout numbers features by descending frequency, so the *resident* set is a
prefix: features ``< n_resident`` keep their rows on the device for the
whole fit, the others (cold) live in host memory.  The device holds one
model buffer of ``n_resident + n_slots`` rows: the resident rows, then
``n_slots`` scratch slots.

An epoch's mini-batch order is known before it starts, so it is cut into
*windows* of consecutive mini-batches whose cold features fit the slots
(:func:`plan_windows`).  For each window, in order: its cold rows are
gathered from the host into the slots, its mini-batches are trained by the
backend's own ``run_epoch`` on a *window layout* whose cold feature ids are
renumbered to slot ids (:func:`window_layout`), and the slots are written
back.  The renumbering keeps the cold ids' order (slots are given in
ascending feature order), so every tile stays sorted by feature and the
hot/cold tile split is unchanged: the kernels run as they are.  With
mini-batches trained in order the model equals the resident fit's: the
same steps, on the same values, in the same order.

Rule: this module plans residency and windows, and moves rows through the
backend's ``gather_rows`` / ``scatter_rows`` (the CUDA backend's kernels
read and write the page-locked host rows in place); it never launches a
kernel of its own, and trains with the backend's ``run_epoch``.  Why: one
training step for every placement keeps the out-of-core model equal to the
resident one.
"""

from dataclasses import dataclass, field

import numpy as np

from ._layout import TileLayout, host_array
from ._read_ahead import _read_ahead
from ._sparse import with_columns
from ._state import ModelState

__all__ = [
    "ResidencyPlan", "Window", "plan_residency", "batch_cold_counts", "batch_runs",
    "cold_sets_run_nnz", "nonzero_runs", "window_nnz",
    "plan_windows", "window_layout", "WindowStats", "HostRows", "run_epoch_out_of_core",
]

#: the arrays of a state with one row per feature
ROW_ARRAYS = ("w", "V", "gw", "gV")
#: the fewest nonzeros a window may hold: its layout is a copy on the
#: device (the nonzeros' 10 bytes, and while it is made an int64 slot and a
#: flag each); :func:`window_nnz` gives it more with more slots
MIN_WINDOW_NNZ = 1 << 22
#: device bytes of a window's layout per nonzero, while it is made
WINDOW_BYTES_PER_NNZ = 4 + 2 + 4 + 8 + 1
#: the share of an out-of-core model's device rows that are scratch slots
SLOT_FRACTION = 0.25
#: rows a backend moves at a time through a device temporary when the host
#: rows are not where its kernels reach them (``gather_rows`` of ordinary
#: memory): a bounded temporary, which the memory plan allows for
PIECE_ROWS = 1 << 16
#: device bytes per nonzero of a run of :func:`cold_sets` (at most
#: :func:`cold_sets_run_nnz` nonzeros, or one mini-batch), an upper bound from its
#: live arrays: the int64 keys, the mask, the selected keys with the mask's
#: scan, then their sort (a copy, the radix sort's buffers, the flags of
#: distinct keys, the output and its scan): at most 8 int64 a nonzero
COLD_SETS_BYTES_PER_NNZ = 8 * 8


@dataclass(frozen=True)
class ResidencyPlan:
    """Where a model's feature rows live during a fit.

    Attributes
    ----------
    n_features : int
    n_resident : int
        Features ``< n_resident`` (the most frequent) stay on the device.
    n_slots : int
        Scratch rows for the cold features of one window.
    row_bytes : int
        Bytes of one feature's row over every row array of the state.
    window_nnz : int
        Most nonzeros of a window (:func:`window_nnz`).
    sets : ColdSets or None
        The mini-batches' cold features at ``n_resident``, found while
        planning (what the windows are cut from); None when every row fits.
    """

    n_features: int
    n_resident: int
    n_slots: int
    row_bytes: int
    window_nnz: int = MIN_WINDOW_NNZ
    sets: object = field(default=None, compare=False, repr=False)

    @property
    def out_of_core(self):
        return self.n_resident < self.n_features

    @property
    def device_rows(self):
        """Rows of the device model buffer."""
        return self.n_resident + self.n_slots

    @property
    def device_bytes(self):
        return self.device_rows * self.row_bytes


@dataclass(frozen=True)
class Window:
    """Consecutive mini-batches of an epoch's order and the cold features
    they touch (sorted, unique, every id ``>= n_resident``)."""

    batches: np.ndarray
    cold: np.ndarray


def state_row_bytes(n_outputs, n_factors, *, adagrad, fit_linear=True, itemsize=4):
    """Bytes of one feature's row: weights, factors and their Adagrad sums."""
    per = (n_outputs if fit_linear else 0) + n_factors
    return int(per * itemsize * (2 if adagrad else 1))


def _host(a):
    """A host (numpy) copy of a numpy or device array."""
    return a.get() if hasattr(a, "get") else np.asarray(a)


@dataclass(frozen=True)
class ColdSets:
    """The distinct cold features (``>= n_resident``) of every mini-batch,
    as host CSR: mini-batch ``b``'s are ``ids[ptr[b]:ptr[b + 1]]``, sorted.
    A mini-batch's sample blocks may share features: they are counted over
    the whole mini-batch."""

    n_resident: int
    ptr: np.ndarray
    ids: np.ndarray

    def counts(self):
        return np.diff(self.ptr)

    def of(self, b):
        return self.ids[self.ptr[b] : self.ptr[b + 1]]


def window_nnz(nnz, model_rows, row_bytes, slot_fraction=SLOT_FRACTION):
    """Most nonzeros of one window of a layout of ``nnz`` when the model
    has ``model_rows`` device rows of ``row_bytes``: the window's layout
    takes as many bytes as the slots (``slot_fraction`` of the rows), at
    least :data:`MIN_WINDOW_NNZ` nonzeros (fewer in a smaller layout).

    Rule: a window's layout grows with its slots.  Why: a window ends where
    its slots or its nonzeros run out, and each window costs a fixed setup
    on top of its training: a bound far below the other cut windows short
    (docs/design/out_of_core.rst)."""
    slots = int(int(model_rows) * slot_fraction) * int(row_bytes)
    return int(min(int(nnz), max(MIN_WINDOW_NNZ, slots // WINDOW_BYTES_PER_NNZ)))


def cold_sets_run_nnz(max_window_nnz):
    """Most nonzeros of a run of :func:`cold_sets` when a window holds at
    most ``max_window_nnz``: its temporaries within a window's layout bytes
    (what the memory plan allows for either; a single wider mini-batch is a
    run of its own)."""
    return max(1, WINDOW_BYTES_PER_NNZ * int(max_window_nnz) // COLD_SETS_BYTES_PER_NNZ)


def cold_sets(layout, n_resident, xp=np, max_nnz=None):
    """:class:`ColdSets` of ``layout`` (its nonzeros of module ``xp``), a
    run of whole mini-batches of at most ``max_nnz`` nonzeros (default
    :func:`cold_sets_run_nnz` of the smallest window) at a time, a wider mini-batch in pieces of
    at most ``max_nnz``: one sort of the run's (mini-batch, feature) keys
    there, then only the distinct pairs come to the host (a mini-batch in
    pieces has its pieces' sets merged there).

    Rule: a pass over every nonzero on the device goes in bounded runs.
    Why: the keys and their sort take :data:`COLD_SETS_BYTES_PER_NNZ` a
    nonzero, several times the layout's own bytes, which the model's
    device budget does not leave."""
    if max_nnz is None:
        max_nnz = cold_sets_run_nnz(min(int(layout.nnz), MIN_WINDOW_NNZ))
    bsp = np.asarray(layout.batch_sblock_ptr, dtype=np.int64)
    tp = np.asarray(layout.tile_ptr, dtype=np.int64)
    start = tp[2 * bsp]  # the first nonzero of each mini-batch, and the end
    n_features = int(layout.n_features)
    keys, pieces_of = [], None
    for b0, b1, a, b in nonzero_runs(start, max_nnz):
        # each nonzero's mini-batch: where its position falls among the ends
        key = xp.searchsorted(xp.asarray(start[b0 + 1 : b1 + 1] - a),
                              xp.arange(b - a, dtype=xp.int64), side="right")
        key += b0
        key *= n_features
        key += layout.feat[a:b]
        key = key[layout.feat[a:b] >= n_resident]
        got = _host(xp.unique(key))
        del key
        if a == start[b0] and b == start[b1]:  # whole mini-batches
            keys.append(got)
            continue
        # a piece of one wide mini-batch: its pieces come one after another
        pieces_of = got if a == start[b0] else np.union1d(pieces_of, got)
        if b == start[b1]:
            keys.append(pieces_of)
    key = np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64)
    del keys  # two int64 a pair at most at once (the memory plan's count)
    ptr = np.zeros(layout.n_batches + 1, dtype=np.int64)
    np.cumsum(np.bincount(key // n_features, minlength=layout.n_batches), out=ptr[1:])
    key %= n_features
    return ColdSets(int(n_resident), ptr, key)


def batch_runs(nnz_per_batch, max_nnz):
    """``[(b0, b1)]``: consecutive runs of mini-batches of at most
    ``max_nnz`` nonzeros together (a wider mini-batch alone), covering them
    all in order."""
    runs, b0, total = [], 0, 0
    for b, k in enumerate(np.asarray(nnz_per_batch, dtype=np.int64).tolist()):
        if b > b0 and total + k > max_nnz:
            runs.append((b0, b))
            b0, total = b, 0
        total += k
    if b0 < len(nnz_per_batch):
        runs.append((b0, len(nnz_per_batch)))
    return runs


def nonzero_runs(start, max_nnz):
    """``[(b0, b1, a, b)]``: runs of the nonzeros ``a:b`` of the mini-batches
    ``b0:b1`` (``start``: the first nonzero of each mini-batch, and the
    end), each at most ``max_nnz`` nonzeros: consecutive whole mini-batches
    (:func:`batch_runs`), a wider one in consecutive pieces of it, in order."""
    out = []
    for b0, b1 in batch_runs(np.diff(start), max_nnz):
        a, b = int(start[b0]), int(start[b1])
        if b1 - b0 == 1 and b - a > max_nnz:
            out += [(b0, b1, p, min(p + int(max_nnz), b)) for p in range(a, b, int(max_nnz))]
        else:
            out.append((b0, b1, a, b))
    return out


def batch_cold_counts(layout, n_resident, xp=np, max_nnz=None):
    """Distinct features ``>= n_resident`` of each mini-batch (int64);
    ``max_nnz`` as :func:`cold_sets` takes it."""
    return cold_sets(layout, n_resident, xp, max_nnz).counts()


def plan_residency(layout, row_bytes, budget_bytes, *, slot_fraction=SLOT_FRACTION, xp=np):
    """The rows that fit ``budget_bytes``: all of them when they fit, else a
    resident prefix and scratch slots for the largest mini-batch's cold set.

    ``slot_fraction`` of the rows that fit go to the slots (the rest are
    resident) unless one mini-batch needs more; windows hold at most
    :func:`window_nnz` of those rows' nonzeros (what the memory plan allows
    for).  Raises a ``MemoryError`` that names the need when not even the
    hot features, one mini-batch's cold rows and the slots fit.
    """
    n = int(layout.n_features)
    row_bytes = int(row_bytes)
    fit_rows = int(budget_bytes) // max(row_bytes, 1)
    if fit_rows >= n:
        return ResidencyPlan(n, n, 0, row_bytes)
    win = window_nnz(layout.nnz, fit_rows, row_bytes, slot_fraction)
    run = cold_sets_run_nnz(win)
    n_slots = max(1, int(fit_rows * slot_fraction))
    for _ in range(8):  # more slots mean fewer resident rows and more cold ones
        n_resident = fit_rows - n_slots
        if n_resident < layout.n_hot:
            break
        sets = cold_sets(layout, n_resident, xp, run)
        need = int(sets.counts().max(initial=0))
        if need <= n_slots:
            return ResidencyPlan(n, n_resident, n_slots, row_bytes, win, sets)
        n_slots = need
    least = layout.n_hot + int(batch_cold_counts(layout, layout.n_hot, xp).max(initial=0))
    raise MemoryError(
        f"the model does not fit: {n} features of {row_bytes} bytes each; the "
        f"budget of {int(budget_bytes):,} bytes holds {fit_rows:,} rows, and training "
        f"needs at least {least:,} ({layout.n_hot:,} hot features and the cold "
        f"features of the widest mini-batch, {least * row_bytes:,} bytes). Raise "
        f"device_memory_limit, or lower n_factors or batch_size."
    )


def plan_windows(sets, batch_order, n_slots, batch_nnz=None, max_nnz=MIN_WINDOW_NNZ):
    """Cut ``batch_order`` into :class:`Window` s whose cold features
    (``sets``: :class:`ColdSets`) fit ``n_slots``, greedily: a window grows
    until the next mini-batch would overflow the slots, or (``batch_nnz``:
    the nonzeros of each mini-batch) take it past ``max_nnz`` nonzeros.
    A generator: each window comes as soon as it is cut (an epoch cuts its
    next windows while it trains on this one).

    A mark per feature (the window that last took it) counts a mini-batch's
    new features in time proportional to its own: no union of the growing
    window's set per mini-batch, whose cost would grow with the window."""
    # int32: half the bytes of the feature-sized array made every epoch
    mark = np.full(int(sets.ids.max(initial=-1)) + 1, -1, dtype=np.int32)
    cur, parts, n_windows = [], [], 0
    size = nnz = 0
    for bt in np.asarray(batch_order, dtype=np.int64):
        mine_nnz = 0 if batch_nnz is None else int(batch_nnz[bt])
        mine = sets.of(bt)
        if mine.size > n_slots:
            raise MemoryError(
                f"mini-batch {int(bt)} touches {mine.size:,} cold features, more "
                f"than the {n_slots:,} scratch slots"
            )
        new = mine[mark[mine] != n_windows]
        if cur and (size + new.size > n_slots or nnz + mine_nnz > max_nnz):
            yield Window(np.asarray(cur, dtype=np.int64), np.sort(np.concatenate(parts)))
            n_windows += 1
            cur, parts, size, nnz = [], [], 0, 0
            new = mine
        mark[new] = n_windows
        parts.append(new)
        size += new.size
        cur.append(int(bt))
        nnz += mine_nnz
    if cur:
        yield Window(np.asarray(cur, dtype=np.int64), np.sort(np.concatenate(parts)))


def _ranges(xp, starts, stops):
    """The concatenation of ``arange(starts[i], stops[i])`` over ``i``."""
    lens = stops - starts
    total = int(lens.sum())
    offs = xp.zeros(lens.shape[0] + 1, dtype=xp.int64)
    xp.cumsum(lens, out=offs[1:])
    seg = xp.repeat(xp.arange(lens.shape[0], dtype=xp.int64), lens)
    return starts[seg] + (xp.arange(total, dtype=xp.int64) - offs[seg])


def ranked_counts(layout):
    """The layout's feature counts in layout order (what a window's are
    taken from: computed once per fit, not per window)."""
    return host_array(layout.feature_counts)[host_array(layout.feature_order)]


class WindowStats:
    """The whole layout's per-feature statistics as every window layout of
    a fit takes them (:func:`window_layout`): buffers of the device model's
    rows, the resident features' part written once (their counts and
    penalty factors), a window's slots filled in per window.  Rule: no
    per-window host pass over, or copy of, the model's resident rows (the
    device's own passes over them, its concurrency shares, run at its
    bandwidth).  Why: those are most of the model, and a window trains a few
    mini-batches.

    With a ``backend`` whose arrays are not numpy (the CUDA backend's) the
    buffers are on its device, the resident part copied there once and a
    window's slots copied in per window (its cold features' values are
    taken on the host): a window layout's statistics are then the device's
    own arrays, which its concurrency damping and penalty factors read
    where they are.  A backend reads them while the window trains, before
    the next window writes them again (the writes are queued after it).

    ``penalty``: the whole layout's penalty factors (layout order) or None.
    """

    def __init__(self, layout, n_resident, n_slots, penalty=None, backend=None):
        r, rows = int(n_resident), int(n_resident) + int(n_slots)
        self.n_resident, self.n_rows = r, int(layout.n_rows)
        self.ranked = ranked_counts(layout).astype(np.int64, copy=False)
        self._counts = np.zeros(rows, dtype=np.int64)
        self._counts[:r] = self.ranked[:r]
        self.penalty, self._factors = None, None
        if penalty is not None:
            self.penalty = np.asarray(penalty, dtype=np.float32)
            self._factors = np.zeros(rows, dtype=np.float32)
            self._factors[:r] = self.penalty[:r]
        self._to_device = None
        if backend is not None and backend.xp is not np:
            self._to_device = backend.to_device
            self._counts = backend.to_device(self._counts)
            if self._factors is not None:
                self._factors = backend.to_device(self._factors)
        #: the window layout's feature order and rank: the identity
        xp = np if self._to_device is None else backend.xp
        self.identity = xp.arange(rows, dtype=xp.int64)

    def counts(self, window):
        """The whole layout's counts of the window's features (unused
        slots: 0), counted over :attr:`n_rows` rows."""
        return self._slots(self._counts, self.ranked, window)

    def factors(self, window):
        """The penalty factors (unused slots: 0), or None."""
        if self.penalty is None:
            return None
        return self._slots(self._factors, self.penalty, window)

    def _slots(self, out, whole, window):
        """``out`` with its slots holding ``whole``'s values of the window's
        cold features, the unused ones 0 (its resident part as it is)."""
        r, c = self.n_resident, window.cold.size
        if self._to_device is None:
            np.take(whole, window.cold, out=out[r : r + c])
        else:
            out[r : r + c] = self._to_device(np.take(whole, window.cold))
        out[r + c :] = 0
        return out


def window_layout(layout, window, n_resident, n_slots, xp=np, penalty=None, stats=None,
                  cold=None):
    """The layout of ``window``'s mini-batches alone, cold ids renumbered to
    slots: feature ``f >= n_resident`` becomes ``n_resident + s`` where
    ``window.cold[s] == f``.

    Its per-feature statistics are the whole layout's, taken to the slots:
    ``penalty_factors`` from ``penalty`` (the whole layout's penalty factors,
    or None when the penalties are not scaled), and ``feature_counts`` the
    whole layout's counts over its rows (``count_rows``: what a backend's
    concurrency damping reads as each feature's frequency); its features are
    in layout order (``feature_order`` the identity).  ``stats``: the fit's
    :class:`WindowStats` (made here from ``penalty`` when None), whose
    buffers the statistics are.  ``cold``: ``window.cold`` on the layout's
    device when the caller has it there (:meth:`HostRows.device_ids`).

    A mini-batch's nonzeros and rows are contiguous in the layout, so the
    window's are slices of it, one per mini-batch, joined: no index array
    per nonzero.  Each nonzero's slot comes from a search of the window's
    sorted cold features.

    Returns ``(layout, rows)``: the window's :class:`TileLayout` (its
    mini-batch ``i`` is ``window.batches[i]``, rows numbered from 0) and the
    original layout rows of its rows, to take the targets and weights with.
    """
    bsp = np.asarray(layout.batch_sblock_ptr, dtype=np.int64)
    srp = np.asarray(layout.sblock_row_ptr, dtype=np.int64)
    tp = np.asarray(layout.tile_ptr, dtype=np.int64)
    bts = window.batches
    g0, g1 = bsp[bts], bsp[bts + 1]
    g = _ranges(np, g0, g1)
    rows = _ranges(np, srp[g0], srp[g1])
    sb_len = srp[g + 1] - srp[g]
    tiles = np.stack((tp[2 * g + 1] - tp[2 * g], tp[2 * g + 2] - tp[2 * g + 1]), 1)
    spans = [slice(a, b) for a, b in zip(tp[2 * g0].tolist(), tp[2 * g1].tolist())]

    def join(a):
        return xp.concatenate([a[s] for s in spans]) if spans else a[:0].copy()

    feat = join(layout.feat)
    # the slot of every nonzero (meaningful for the cold ones), written over
    # the cold ids in place
    slot = xp.searchsorted(xp.asarray(window.cold) if cold is None else cold, feat)
    slot += n_resident
    xp.copyto(feat, slot, casting="unsafe", where=feat >= n_resident)
    del slot

    def ptr(counts):
        out = np.zeros(counts.shape[0] + 1, dtype=np.int64)
        np.cumsum(counts, out=out[1:])
        return out

    if stats is None:
        stats = WindowStats(layout, n_resident, n_slots, penalty)
    sub = TileLayout(
        n_rows=int(rows.shape[0]),
        n_features=int(n_resident + n_slots),
        batch_size=layout.batch_size,
        sample_block=layout.sample_block,
        n_hot=layout.n_hot,
        feat=feat,
        row=join(layout.row),
        val=join(layout.val),
        tile_ptr=ptr(tiles.ravel()),
        sblock_row_ptr=ptr(sb_len),
        batch_sblock_ptr=ptr(g1 - g0),
        row_order=rows,
        feature_order=stats.identity,
        feature_rank=stats.identity,
        feature_counts=stats.counts(window),
        penalty_factors=stats.factors(window),
        count_rows=stats.n_rows,
    )
    return sub, rows


def slot_features(window, n_resident, n_slots):
    """The layout feature of each row of the device buffer during
    ``window`` (unused slots: -1)."""
    ids = np.full(n_resident + n_slots, -1, dtype=np.int64)
    ids[:n_resident] = np.arange(n_resident)
    ids[n_resident : n_resident + window.cold.size] = window.cold
    return ids


class HostRows:
    """The cold rows of a state in host memory, and the device buffer.

    ``state``: a full state in layout feature order (numpy); ``sets``: the
    layout's :class:`ColdSets` at ``plan.n_resident``.  The state's rows
    ``>= n_resident`` stay on the host, in the state's arrays as the
    backend's ``host_rows`` keeps them (page-locked for the CUDA backend,
    which its row kernels read and write in place), updated there; the
    device buffer (:attr:`device`, the backend's state: ``backend.put_state``
    of the resident rows and zeroed slots) holds the rest.  :meth:`load` and
    :meth:`store` move a window's cold rows in and out (``gather_rows`` and
    ``scatter_rows``, queued on the backend); :meth:`result` writes the
    resident rows back and returns the full state.
    """

    def __init__(self, state, plan, sets, backend):
        self.plan, self.state, self.sets, self.backend = plan, state, sets, backend
        r, s = plan.n_resident, plan.n_slots
        buf = {}
        for k, a in state.arrays().items():
            if k in ROW_ARRAYS:
                buf[k] = np.zeros((r + s,) + a.shape[1:], dtype=a.dtype)
                buf[k][:r] = a[:r]
            else:
                buf[k] = a.copy()
        self.device = backend.put_state(ModelState(**buf))
        del buf
        for k in ROW_ARRAYS:
            if getattr(state, k) is not None:
                setattr(state, k, backend.host_rows(getattr(state, k)))
        self._ids = (None, None)

    def device_ids(self, cold):
        """``cold`` on the backend (kept for the window's layout, its
        :meth:`load` and the :meth:`store` that follows)."""
        if self._ids[0] is not cold:
            self._ids = (cold, self.backend.to_device(np.asarray(cold, dtype=np.int64)))
        return self._ids[1]

    def _slots(self, cold):
        """``cold`` on the backend, and ``(host rows, device slots)`` of each
        row array: the first ``cold.size`` slots."""
        r, n = self.plan.n_resident, cold.size
        pairs = [(getattr(self.state, k), getattr(self.device, k)[r : r + n])
                 for k in ROW_ARRAYS if getattr(self.state, k) is not None]
        return self.device_ids(cold), pairs

    def load(self, cold):
        """The rows of features ``cold`` (sorted, distinct, cold) into the
        first ``cold.size`` slots."""
        if cold.size:
            ids, pairs = self._slots(cold)
            for host, slots in pairs:
                self.backend.gather_rows(host, ids, slots)

    def store(self, cold):
        """The slots back into the host rows of features ``cold`` (those of
        the last :meth:`load`)."""
        if cold.size:
            ids, pairs = self._slots(cold)
            for host, slots in pairs:
                self.backend.scatter_rows(slots, ids, host)

    def result(self):
        """The full state (layout order, numpy), the resident rows and the
        intercepts copied back from the device."""
        r, to_host = self.plan.n_resident, self.backend.to_host
        self.backend.synchronize()  # the slots' last rows are on the host
        for k, a in self.state.arrays().items():
            if k in ROW_ARRAYS:  # the resident rows: the slots are written back already
                to_host(getattr(self.device, k)[:r], out=a[:r])
            else:
                to_host(getattr(self.device, k), out=a)
        return self.state


def run_epoch_out_of_core(backend, layout, y, sw, batch_weight, rows, params,
                          batch_order, *, penalty_scale=None, workers=None, xp=np,
                          stats=None, ramp=0):
    """One epoch over ``batch_order`` with the model's cold rows on the host.

    ``rows``: a :class:`HostRows`; ``y``, ``sw`` and ``batch_weight`` as the
    backend's ``run_epoch`` takes them for ``layout`` (numpy).
    ``penalty_scale``: the full layout's per-feature penalty factor (layout
    order) when ``params`` scales the penalties: a window layout would count
    its own mini-batches only.  ``xp``: the module of the layout's nonzeros;
    ``stats``: the fit's :class:`WindowStats` (made here if None).
    ``ramp``: the first epoch's warm-up, carried across the windows (each
    window's ``run_epoch`` goes on from the warm-up's mini-batches the
    windows before it trained: the resident epoch's stages).
    Returns ``(loss, n_windows)``: the epoch's weighted loss sum and its
    windows (the log's count).
    """
    plan = rows.plan
    bsp = np.asarray(layout.batch_sblock_ptr, dtype=np.int64)
    tp = np.asarray(layout.tile_ptr, dtype=np.int64)
    batch_nnz = tp[2 * bsp[1:]] - tp[2 * bsp[:-1]]
    if stats is None:
        stats = WindowStats(layout, plan.n_resident, plan.n_slots, penalty_scale, backend)
    total, done, n_windows = 0.0, 0, 0
    # the next windows are cut by a background thread while this one trains
    # (the cut is a pass over every cold set of the epoch, on the host)
    windows = _read_ahead(plan_windows(rows.sets, batch_order, plan.n_slots, batch_nnz,
                                       plan.window_nnz), 2)
    try:
        for win in windows:
            # the slot search runs where the layout's nonzeros are: a layout
            # left on the host (streamed) searches the host's ids
            cold = rows.device_ids(win.cold) if xp is not np else None
            sub, lrows = window_layout(layout, win, plan.n_resident, plan.n_slots, xp,
                                       stats=stats, cold=cold)
            rows.load(win.cold)
            total += float(backend.run_epoch(
                backend.put_layout(sub), backend.to_device(y[lrows]),
                backend.to_device(sw[lrows]), batch_weight[win.batches], rows.device,
                params, np.arange(win.batches.size), workers=workers, ramp=ramp,
                ramp_done=done,
            ))
            rows.store(win.cold)
            done += win.batches.size
            n_windows += 1
            # this window's layout goes before the next one's is made: the
            # memory plan counts one window's
            del sub, lrows
    finally:  # an epoch that fails stops the cutting thread now, not when collected
        windows.close()
    return total, n_windows


def predict_chunks(X, n_slots, max_rows=None):
    """Cut the rows of a CSR matrix (scipy) into runs whose distinct columns
    fit ``n_slots`` (and of at most ``max_rows`` rows): ``[(r0, r1, cols)]``,
    ``cols`` sorted.  Runs are halved until they fit (vectorised: no Python
    loop per row); a single row with more distinct columns than slots is
    refused."""
    indptr, indices = X.indptr, X.indices
    if max_rows is None:
        max_rows = max(X.shape[0], 1)
    step = int(max_rows)
    out, todo = [], [(a, min(a + step, X.shape[0])) for a in range(0, X.shape[0], step)][::-1]
    if not todo:
        todo = [(0, 0)]
    while todo:
        r0, r1 = todo.pop()
        cols = np.unique(indices[indptr[r0] : indptr[r1]]).astype(np.int64)
        if cols.size <= n_slots:
            out.append((r0, r1, cols))
        elif r1 - r0 == 1:
            raise MemoryError(
                f"row {r0} has {cols.size:,} distinct features, more than the "
                f"{n_slots:,} rows of the model the device-memory limit leaves"
            )
        else:
            mid = (r0 + r1) // 2
            todo += [(mid, r1), (r0, mid)]
    return out


def decision_function_out_of_core(backend, X, w, b, V, n_slots, *, fit_linear=True,
                                  max_rows=None):
    """Decision values of a canonical CSR ``X`` (scipy, user feature order)
    with at most ``n_slots`` rows of the model on the device at a time: for
    each run of rows (:func:`predict_chunks`), the model rows of its columns
    go to the device and the run's column ids are renumbered to them (in
    order, so each row sums its terms in the same order as the full
    product).  Returns float64 ``(n_samples, n_outputs)`` on the host."""
    out = np.empty((X.shape[0], w.shape[1]))
    for r0, r1, cols in predict_chunks(X, n_slots, max_rows):
        part = X[r0:r1]
        Xc = with_columns(part, cols)
        Z = backend.decision_function(
            backend.put_csr(Xc), backend.to_device(w[cols]), backend.to_device(b),
            None if V is None else backend.to_device(V[cols]), fit_linear=fit_linear,
        )
        out[r0:r1] = np.asarray(backend.to_host(Z))
    return out


class OutOfCoreModel:
    """A mini-batch fit's model when it does not fit the device: what
    :func:`sklearn_cuwide._solvers.fit_minibatch` uses instead of a device
    state.

    ``state``: the starting state (user feature order, numpy; factors not
    drawn yet are drawn in layout order with the same generator, by the
    backend's device a part at a time, into host memory); ``model_rows``: the device rows the model may take (the
    memory plan's).  Raises ``MemoryError`` when not even the hot features
    and the widest mini-batch's cold ones fit.
    """

    def __init__(self, backend, layout, state, params, model_rows):
        from ._backends import _cpu
        from ._layout import penalty_scale

        self.backend, self.layout, self.params = backend, layout, params
        xp = _array_module(layout.feat, backend)
        adagrad = state.gw is not None
        row_bytes = state_row_bytes(state.n_outputs, state.n_factors, adagrad=adagrad,
                                    fit_linear=True, itemsize=state.w.dtype.itemsize)
        # factors not drawn yet are drawn by the device, in parts of at most
        # 1/64 of the model's rows (the draw's temporaries: ~40 bytes a value),
        # straight into the host rows the fit keeps (page-locked for the CUDA
        # backend): no second host copy of the model
        host = state.put_in_layout_order(host_array(layout.feature_order), _cpu,
                                         draw_with=backend,
                                         draw_rows=min(1 << 20, max(1, model_rows // 64)),
                                         empty=backend.empty_host_rows)
        # the plan's cold sets are those the windows are cut from: found once
        self.plan = plan_residency(layout, row_bytes, int(model_rows) * row_bytes, xp=xp)
        # the whole layout's penalty factors before the model takes the
        # device: their computation's temporaries are O(n_features)
        self.penalty = None
        if params.penalty_scaled:
            self.penalty = _host(penalty_scale(layout, xp)).astype(np.float64)
        backend.release_cached()  # the setup's freed blocks, before the model's
        self.rows = HostRows(host, self.plan, self.plan.sets, backend)
        self._xp = xp
        self._stats = WindowStats(layout, self.plan.n_resident, self.plan.n_slots,
                                  self.penalty, backend)
        #: the windows of the last epoch
        self.n_windows = 0

    def epoch(self, y_l, sw_l, batch_weight, order, workers=None, ramp=0):
        """One epoch in ``order`` (``ramp``: the first epoch's warm-up); its
        weighted loss sum (:attr:`n_windows`: its windows)."""
        loss, self.n_windows = run_epoch_out_of_core(
            self.backend, self.layout, y_l, sw_l, batch_weight, self.rows, self.params,
            order, penalty_scale=self.penalty, workers=workers, xp=self._xp,
            stats=self._stats, ramp=ramp)
        return loss

    def state(self):
        """The whole state now (layout order, numpy)."""
        return self.rows.result()

    def decision_function(self, X, state=None):
        """Decision values of ``X`` (scipy CSR in *layout* feature order)
        with ``state`` (default: :meth:`state`, the model now), a device's
        worth of rows at a time."""
        st = self.state() if state is None else state
        return decision_function_out_of_core(
            self.backend, X, st.w, st.b, st.V, self.plan.device_rows,
            fit_linear=self.params.fit_linear)


def _array_module(a, backend):
    """numpy for a host array, else the backend's module."""
    return np if isinstance(a, np.ndarray) else backend.xp
