"""Out-of-core models: residency and window planning against numpy
references, and epochs with the cold rows on the host equal to resident
epochs (CPU backend, mini-batches in order)."""

import copy
from dataclasses import replace

import numpy as np
import pytest
from numpy.testing import assert_array_equal
import scipy.sparse as sp

from sklearn_cuwide import _out_of_core as ooc
from sklearn_cuwide._backends import _cpu
from sklearn_cuwide._layout import build_layout, penalty_scale
from sklearn_cuwide._solvers import batch_weights
from sklearn_cuwide._state import ModelState, StepParams


def _data(seed=0, n=600, d=300, zipf=1.3):
    """Rows of Zipf-distributed features (a few hot ones, a long cold tail)."""
    rng = np.random.default_rng(seed)
    per_row = 6
    cols = np.minimum(rng.zipf(zipf, size=n * per_row) - 1, d - 1)
    rows = np.repeat(np.arange(n), per_row)
    X = sp.csr_matrix((rng.uniform(0.5, 1.5, n * per_row), (rows, cols)), shape=(n, d))
    X.sum_duplicates()
    y = (rng.uniform(size=n) < 0.4).astype(np.float32)
    return X, y


def _fm_host_rows():
    """An FM of 4 factors whose rows live on the host, 90 of them on the
    device: ``(layout, targets and weights in layout order, step
    parameters, HostRows)`` on the CPU backend."""
    X, y = _data(seed=7, n=2000)
    L = _layout(X)
    params = StepParams(model="fm", solver="adagrad", learning_rate=0.05, l2_w=1e-3,
                        l2_v=1e-3)
    state = ModelState.zeros(L.n_features, 1, 4, adagrad=True, init_scale=0.1,
                             random_state=0)
    rb = ooc.state_row_bytes(1, 4, adagrad=True)
    plan = ooc.plan_residency(L, rb, 90 * rb)
    return L, y[L.row_order], np.ones(L.n_rows), params, ooc.HostRows(state, plan,
                                                                      plan.sets, _cpu)


def _windows(*args):
    """:func:`plan_windows`'s windows as a list."""
    return list(ooc.plan_windows(*args))


def _layout(X, batch_size=32, sample_block=16, n_hot_max=8):
    return build_layout(X, batch_size=batch_size, sample_block=sample_block,
                        n_hot_max=n_hot_max, shuffle=True, random_state=1)


@pytest.mark.parametrize("max_nnz", [1, 500, 10**9])
def test_cold_sets_against_a_loop(max_nnz):
    """Each mini-batch's distinct cold features, found a run of mini-batches
    of at most ``max_nnz`` nonzeros at a time (1: every mini-batch in
    pieces of one nonzero, their sets merged)."""
    X, _ = _data()
    L = _layout(X)
    nnz = np.diff(L.tile_ptr[2 * L.batch_sblock_ptr])
    runs = ooc.batch_runs(nnz, max_nnz)
    assert runs[0][0] == 0 and runs[-1][1] == L.n_batches
    assert all(a[1] == b[0] for a, b in zip(runs[:-1], runs[1:]))
    assert all(b - a == 1 or nnz[a:b].sum() <= max_nnz for a, b in runs)
    expected = {1: (L.n_batches, L.n_batches), 500: (2, L.n_batches - 1), 10**9: (1, 1)}
    assert expected[max_nnz][0] <= len(runs) <= expected[max_nnz][1]
    start = L.tile_ptr[2 * L.batch_sblock_ptr]
    pieces = ooc.nonzero_runs(start, max_nnz)
    assert pieces[0][2] == 0 and pieces[-1][3] == L.nnz
    assert all(p[3] == q[2] for p, q in zip(pieces[:-1], pieces[1:]))  # contiguous
    assert all(b - a <= max_nnz for _, _, a, b in pieces)  # wide batches cut too
    for b0, b1, a, b in pieces:  # whole mini-batches, or a piece of one
        assert (a, b) == (start[b0], start[b1]) or (b1 == b0 + 1 and start[b0] <= a < b
                                                     <= start[b1])
    for n_res in (0, 5, 40, L.n_features):
        sets = ooc.cold_sets(L, n_res, max_nnz=max_nnz)
        got = ooc.batch_cold_counts(L, n_res)
        for bt in range(L.n_batches):
            g0, g1 = L.batch_sblock_ptr[bt], L.batch_sblock_ptr[bt + 1]
            f = L.feat[L.tile_ptr[2 * g0] : L.tile_ptr[2 * g1]]
            assert got[bt] == np.unique(f[f >= n_res]).size
            np.testing.assert_array_equal(sets.of(bt), np.unique(f[f >= n_res]))


@pytest.mark.parametrize("extra", [0, 30, 1000])
def test_windows_cover_the_order_and_fit_the_slots(extra):
    X, _ = _data()
    L = _layout(X)
    n_res = 10
    n_slots = int(ooc.batch_cold_counts(L, n_res).max()) + extra
    order = np.random.default_rng(3).permutation(L.n_batches)
    wins = _windows(ooc.cold_sets(L, n_res), order, n_slots)
    np.testing.assert_array_equal(np.concatenate([w.batches for w in wins]), order)
    for i, w in enumerate(wins):
        ref = np.unique(np.concatenate([
            L.feat[L.tile_ptr[2 * L.batch_sblock_ptr[b]] :
                   L.tile_ptr[2 * L.batch_sblock_ptr[b + 1]]] for b in w.batches
        ]).astype(np.int64))
        np.testing.assert_array_equal(w.cold, ref[ref >= n_res])
        assert w.cold.size <= n_slots
        if i + 1 < len(wins):  # greedy: the next mini-batch would not have fit
            nxt = wins[i + 1].batches[0]
            g0, g1 = L.batch_sblock_ptr[nxt], L.batch_sblock_ptr[nxt + 1]
            f = L.feat[L.tile_ptr[2 * g0] : L.tile_ptr[2 * g1]].astype(np.int64)
            assert np.union1d(w.cold, f[f >= n_res]).size > n_slots


def _greedy_windows(sets, order, n_slots, batch_nnz, max_nnz):
    """The one-at-a-time greedy cut: ``[(batches, cold)]``."""
    out, cur, cold, nnz = [], [], set(), 0
    for bt in order:
        mine = set(sets.of(bt).tolist())
        if cur and (len(cold | mine) > n_slots or nnz + batch_nnz[bt] > max_nnz):
            out.append((cur, sorted(cold)))
            cur, cold, nnz = [], set(), 0
        cur.append(bt)
        cold |= mine
        nnz += batch_nnz[bt]
    return out + [(cur, sorted(cold))]


@pytest.mark.parametrize("zipf", [1.05, 1.3, 2.0])
def test_windows_are_the_greedy_cut(zipf):
    """The windows are those of a loop over one mini-batch at a time with
    the window's set kept whole, for cold sets that share little or much,
    under either bound."""
    X, _ = _data(seed=4, n=1500, d=400, zipf=zipf)
    L = _layout(X, batch_size=16, sample_block=16)
    bsp, tp = L.batch_sblock_ptr, L.tile_ptr
    batch_nnz = tp[2 * bsp[1:]] - tp[2 * bsp[:-1]]
    rng = np.random.default_rng(7)
    for n_res in (0, 5, 40):
        sets = ooc.cold_sets(L, n_res)
        widest = int(sets.counts().max())
        for n_slots in (widest, widest + 3, 4 * widest, L.n_features):
            for cap in (int(batch_nnz.max()), 5 * int(batch_nnz.max()), 10**9):
                order = rng.permutation(L.n_batches)
                got = _windows(sets, order, n_slots, batch_nnz, cap)
                ref = _greedy_windows(sets, order, n_slots, batch_nnz, cap)
                assert len(got) == len(ref)
                for w, (batches, cold) in zip(got, ref):
                    assert_array_equal(w.batches, batches)
                    assert_array_equal(w.cold, cold)


def test_window_nonzeros_grow_with_the_slots():
    rb = 264
    small = ooc.window_nnz(10**9, 1000, rb)
    assert small == ooc.MIN_WINDOW_NNZ  # few slots: the least window
    assert ooc.window_nnz(1000, 10**8, rb) == 1000  # never past the layout
    rows = 4 * 10**6
    got = ooc.window_nnz(10**9, rows, rb)
    # the window's layout takes the slots' bytes
    slot_bytes = int(rows * ooc.SLOT_FRACTION) * rb
    assert got * ooc.WINDOW_BYTES_PER_NNZ <= slot_bytes
    assert (got + 1) * ooc.WINDOW_BYTES_PER_NNZ > slot_bytes


def test_a_mini_batch_wider_than_the_slots_is_refused():
    X, _ = _data()
    L = _layout(X)
    widest = int(ooc.batch_cold_counts(L, 0).max())
    with pytest.raises(MemoryError, match="cold features"):
        _windows(ooc.cold_sets(L, 0), np.arange(L.n_batches), widest - 1)


def test_window_stats_on_a_device_copy_the_slots_alone():
    """With a backend whose arrays are not numpy, a fit's window statistics
    live on its device: the resident part copied there once, then for each
    window only its cold features' values; the same values as the host
    buffers.  (A stand-in device: its arrays are numpy copies.)"""
    import types

    X, _ = _data()
    L = _layout(X)
    n_res, n_slots = 12, 200
    penalty = penalty_scale(L).astype(np.float64)
    sizes, made = [], []

    def to_device(a):
        sizes.append(np.size(a))
        made.append(np.array(a, copy=True))
        return made[-1]

    dev = types.SimpleNamespace(
        xp=types.SimpleNamespace(arange=np.arange, int64=np.int64), to_device=to_device)
    host = ooc.WindowStats(L, n_res, n_slots, penalty)
    on_dev = ooc.WindowStats(L, n_res, n_slots, penalty, dev)
    assert sizes == [n_res + n_slots] * 2  # the counts and the factors, once
    buffers = list(made)
    assert_array_equal(on_dev.identity, np.arange(n_res + n_slots))
    order = np.random.default_rng(2).permutation(L.n_batches)
    for w in _windows(ooc.cold_sets(L, n_res), order, n_slots):
        sizes.clear()
        assert_array_equal(on_dev.counts(w), host.counts(w))
        assert_array_equal(on_dev.factors(w), host.factors(w))
        assert sizes == [w.cold.size] * 2
        # the device's buffers, written in place
        assert on_dev.counts(w) is buffers[0] and on_dev.factors(w) is buffers[1]


@pytest.mark.parametrize("fresh", [True, False])
def test_the_host_rows_are_made_in_place(fresh):
    """An out-of-core model's host state in layout order is written into
    the arrays the backend makes for its rows (``empty_host_rows``: the
    CUDA backend's page-locked memory), with the same values as the state
    made the usual way; the factors drawn by another backend (the device,
    here a stand-in on numpy) in parts."""
    import types

    d, k = 1000, 4
    order = np.random.default_rng(3).permutation(d)
    state = ModelState.zeros(d, 1, k, adagrad=True, init_scale=0.1, random_state=5,
                             draw=False)
    if not fresh:  # a continued model: every array holds values
        state.w[:] = np.arange(d, dtype=np.float32)[:, None]
        state.gw[:] = 2.0
    made = []

    def empty(shape, dtype):
        made.append(np.empty(shape, dtype=dtype))
        made[-1].fill(np.nan)  # what an allocation may hold
        return made[-1]

    device = types.SimpleNamespace(xp=np, to_device=lambda a: a, to_host=_cpu.to_host,
                                   draw_factors=_cpu.draw_factors)
    got = state.put_in_layout_order(order, _cpu, draw_with=device, draw_rows=128,
                                    empty=empty)
    ref = state.put_in_layout_order(order, _cpu)
    for name in ("w", "V", "gw", "gV"):
        a = getattr(got, name)
        assert any(a is m for m in made), name
        assert_array_equal(a, getattr(ref, name), err_msg=name)


def test_an_out_of_core_model_keeps_the_rows_its_backend_made():
    """OutOfCoreModel makes its host state through the backend's
    ``empty_host_rows``, the factors drawn by the backend into them, and
    trains on those arrays (no second copy).  (A device stand-in: the CPU
    backend under another name, so that it draws as a device does.)"""
    X, y = _data(seed=7, n=2000)
    L = _layout(X)
    params = StepParams(model="fm", solver="adagrad", learning_rate=0.05, l2_w=1e-3,
                        l2_v=1e-3)
    state = ModelState.zeros(L.n_features, 1, 4, adagrad=True, init_scale=0.1,
                             random_state=0, draw=False)
    made = []

    class Device:
        def __getattr__(self, name):
            return getattr(_cpu, name)

        def empty_host_rows(self, shape, dtype):
            made.append(np.empty(shape, dtype=dtype))
            return made[-1]

    model = ooc.OutOfCoreModel(Device(), L, state, params, 90)
    assert model.plan.out_of_core
    for name in ("w", "V", "gw", "gV"):
        assert any(getattr(model.rows.state, name) is m for m in made), name


def test_an_epoch_that_fails_stops_cutting_windows():
    """The windows are cut by a background thread; an error in a window's
    training reaches the caller and stops that thread at once."""
    import threading

    L, yl, swl, params, rows = _fm_host_rows()
    calls = []

    class Failing:
        def __getattr__(self, name):
            return getattr(_cpu, name)

        def run_epoch(self, *a, **kw):
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("the device went away")
            return _cpu.run_epoch(*a, workers=None)

    def cutting():
        return [t for t in threading.enumerate() if t.name == "sklearn_cuwide-read-ahead"]

    # the error kept (its traceback holds the epoch's frame, as a caller's
    # handler or a debugger would): the thread must stop all the same
    with pytest.raises(RuntimeError, match="went away") as caught:
        ooc.run_epoch_out_of_core(Failing(), L, yl, swl, batch_weights(L, swl), rows,
                                  params, np.arange(L.n_batches))
    for t in cutting():
        t.join(2.0)
    assert not cutting() and caught.value is not None


def test_window_layout_renumbers_monotonically_and_keeps_the_nonzeros():
    X, _ = _data()
    L = _layout(X)
    n_res, n_slots = 12, 200
    order = np.random.default_rng(5).permutation(L.n_batches)
    for w in _windows(ooc.cold_sets(L, n_res), order, n_slots):
        sub, rows = ooc.window_layout(L, w, n_res, n_slots)
        ids = ooc.slot_features(w, n_res, n_slots)
        assert sub.n_batches == w.batches.size
        # each sample block of the window: same nonzeros, ids mapped back
        g_src = np.concatenate([np.arange(L.batch_sblock_ptr[b], L.batch_sblock_ptr[b + 1])
                                for b in w.batches])
        for gi, g in enumerate(g_src):
            a, h, e = L.tile_ptr[2 * g : 2 * g + 3]
            sa, sh, se = sub.tile_ptr[2 * gi : 2 * gi + 3]
            assert (h - a, e - h) == (sh - sa, se - sh)
            np.testing.assert_array_equal(ids[sub.feat[sa:se]], L.feat[a:e])
            np.testing.assert_array_equal(sub.row[sa:se], L.row[a:e])
            np.testing.assert_array_equal(sub.val[sa:se], L.val[a:e])
            assert np.all(np.diff(sub.feat[sa:sh]) >= 0)
            assert np.all(np.diff(sub.feat[sh:se]) >= 0)  # still sorted
            r0, r1 = L.sblock_row_ptr[g], L.sblock_row_ptr[g + 1]
            np.testing.assert_array_equal(
                rows[sub.sblock_row_ptr[gi] : sub.sblock_row_ptr[gi + 1]], np.arange(r0, r1))


def test_plan_residency():
    X, _ = _data()
    L = _layout(X)
    rb = ooc.state_row_bytes(1, 4, adagrad=True)
    assert rb == (1 + 4) * 4 * 2
    full = ooc.plan_residency(L, rb, L.n_features * rb)
    assert not full.out_of_core and full.n_slots == 0
    p = ooc.plan_residency(L, rb, 120 * rb)
    assert p.out_of_core and p.device_rows <= 120 and p.n_resident >= L.n_hot
    assert p.window_nnz == ooc.window_nnz(L.nnz, 120, rb)
    # the cold sets it found, kept for the windows
    ref = ooc.cold_sets(L, p.n_resident)
    assert_array_equal(p.sets.ptr, ref.ptr)
    assert_array_equal(p.sets.ids, ref.ids)
    assert ooc.batch_cold_counts(L, p.n_resident).max() <= p.n_slots
    with pytest.raises(MemoryError, match="device_memory_limit"):
        ooc.plan_residency(L, rb, (L.n_hot + 1) * rb)


@pytest.mark.parametrize("model,solver,scaled", [
    ("linear", "adagrad", True), ("linear", "sgd", False),
    ("fm", "adagrad", False), ("fm", "sgd", True),
])
def test_out_of_core_epochs_equal_resident_epochs(model, solver, scaled):
    X, y = _data(seed=7)
    L = _layout(X)
    sw = np.random.default_rng(2).uniform(0.5, 2.0, L.n_rows)
    yl, swl = y[L.row_order], sw[L.row_order]
    bw = batch_weights(L, swl)
    params = StepParams(model=model, solver=solver, learning_rate=0.05, l2_w=1e-3,
                        l2_v=1e-3, l1=1e-4 if model == "linear" else 0.0,
                        penalty_scaled=scaled)
    k = 4 if model == "fm" else 0
    state = ModelState.zeros(L.n_features, 1, k, adagrad=solver == "adagrad",
                             init_scale=0.1, random_state=0)
    resident = copy.deepcopy(state)
    rb = ooc.state_row_bytes(1, k, adagrad=solver == "adagrad")
    plan = ooc.plan_residency(L, rb, 90 * rb)
    assert plan.out_of_core
    sets = ooc.cold_sets(L, plan.n_resident)
    rows = ooc.HostRows(copy.deepcopy(state), plan, sets, _cpu)
    ps = penalty_scale(L).astype(np.float64) if scaled else None
    rng = np.random.default_rng(11)
    n_windows = 0
    for _ in range(2):
        order = rng.permutation(L.n_batches)
        n_windows += len(_windows(sets, order, plan.n_slots))
        ref = _cpu.run_epoch(L, yl, swl, bw, resident, params, order)
        got, _ = ooc.run_epoch_out_of_core(_cpu, L, yl, swl, bw, rows, params, order,
                                           penalty_scale=ps)
        assert got == pytest.approx(ref, rel=1e-12)
    assert n_windows > 2  # the cold rows really went back and forth
    out = rows.result()
    for k_, a in resident.arrays().items():
        np.testing.assert_array_equal(getattr(out, k_), a, err_msg=k_)


def test_the_first_epochs_warm_up_is_carried_across_windows():
    """Each window of a warming-up epoch goes on with the warm-up where the
    windows before it left it (``ramp_done``: their mini-batches), on the
    epoch's workers; a later epoch (no ramp) has no warm-up."""
    L, yl, swl, params, rows = _fm_host_rows()
    bw = batch_weights(L, swl)
    plan, sets = rows.plan, rows.sets
    seen = []

    class Recording:  # the CPU backend, recording each window's workers
        def __getattr__(self, name):
            return getattr(_cpu, name)

        def run_epoch(self, *a, workers=None, ramp=0, ramp_done=0, **kw):
            seen.append((workers, ramp, ramp_done, a[-1].size))
            return _cpu.run_epoch(*a, **kw)  # in order: the CPU has no workers

    order = np.arange(L.n_batches)
    windows = _windows(sets, order, plan.n_slots)
    assert len(windows) > 3
    ooc.run_epoch_out_of_core(Recording(), L, yl, swl, bw, rows, params, order,
                              workers=8, ramp=2)
    done, want = 0, []
    for w in windows:
        want.append((8, 2, done, w.batches.size))
        done += w.batches.size
    assert seen == want
    seen.clear()
    ooc.run_epoch_out_of_core(Recording(), L, yl, swl, bw, rows, params, order, workers=8)
    assert [(w, r) for w, r, _, _ in seen] == [(8, 0)] * len(windows)


@pytest.mark.parametrize("fm", [False, True])
def test_prediction_with_a_few_model_rows_equals_the_full_product(fm):
    X, _ = _data(seed=4, n=300)
    X = X.tocsr()
    rng = np.random.default_rng(0)
    w = rng.normal(size=(X.shape[1], 1)).astype(np.float32)
    V = rng.normal(size=(X.shape[1], 3)).astype(np.float32) if fm else None
    b = np.array([0.25], dtype=np.float32)
    ref = _cpu.decision_function(X, w, b, V)
    widest = int(np.diff(X.indptr).max())
    for n_slots in (widest, 3 * widest, X.shape[1]):
        chunks = ooc.predict_chunks(X, n_slots)
        assert [c[0] for c in chunks][1:] == [c[1] for c in chunks][:-1]
        assert all(c[2].size <= n_slots for c in chunks)
        got = ooc.decision_function_out_of_core(_cpu, X, w, b, V, n_slots)
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    with pytest.raises(MemoryError, match="distinct features"):
        ooc.predict_chunks(X, widest - 1)


def test_window_layout_carries_the_whole_layouts_statistics():
    X, _ = _data(seed=9)
    L = _layout(X)
    n_res = 12
    n_slots = int(ooc.batch_cold_counts(L, n_res).max()) + 10
    ps = penalty_scale(L).astype(np.float64)
    ranked = L.feature_counts[L.feature_order]
    order = np.arange(L.n_batches)
    wins = _windows(ooc.cold_sets(L, n_res), order, n_slots)
    assert len(wins) > 1
    for w in wins:
        sub, rows = ooc.window_layout(L, w, n_res, n_slots, penalty=ps)
        ids = ooc.slot_features(w, n_res, n_slots)
        used = ids >= 0
        np.testing.assert_array_equal(sub.penalty_factors[used], ps[ids[used]])
        assert np.all(sub.penalty_factors[~used] == 0)
        # the whole layout's counts, over its rows
        assert_array_equal(sub.feature_counts[used], ranked[ids[used]])
        assert np.all(sub.feature_counts[~used] == 0)
        assert sub.count_rows == L.n_rows and sub.n_rows < L.n_rows
        # the window's own count would differ: its features are penalised
        # as the whole layout penalises them
        own = penalty_scale(sub)
        assert not np.allclose(own[used], ps[ids[used]])


@pytest.mark.parametrize("model,solver,scaled", [
    ("linear", "adagrad", True), ("fm", "adagrad", False), ("fm", "sgd", True),
])
def test_fit_minibatch_out_of_core_equals_the_resident_fit(model, solver, scaled):
    from sklearn_cuwide._solvers import fit_minibatch

    X, y = _data(seed=13, n=700)
    L = _layout(X)
    sw = np.random.default_rng(4).uniform(0.5, 2.0, X.shape[0])
    params = StepParams(model=model, solver=solver, learning_rate=0.05, l2_w=1e-3,
                        l2_v=1e-3, penalty_scaled=scaled)
    k = 4 if model == "fm" else 0

    def start():  # factors drawn when the fit places the state, as estimators do
        st = ModelState.zeros(X.shape[1], 1, k, adagrad=solver == "adagrad",
                              init_scale=0.1, random_state=3, draw=False)
        st.b[:] = 0.1
        return st

    Xv, yv = _data(seed=14, n=200)
    val = (Xv.tocsr(), yv.astype(np.float64), np.ones(200))
    kw = dict(backend=_cpu, max_iter=3, shuffle=True, random_state=5, validation=val)
    ref = fit_minibatch(L, y, sw, start(), params, **kw)
    got = fit_minibatch(L, y, sw, start(), params, model_rows=80, **kw)
    assert got[1] == ref[1]
    # the curves: the epoch's loss is summed window by window (rounding)
    np.testing.assert_allclose(got[2], ref[2], rtol=1e-13)
    np.testing.assert_allclose(got[3], ref[3], rtol=1e-13)
    for name, a in ref[0].arrays().items():
        np.testing.assert_array_equal(getattr(got[0], name), a, err_msg=name)
    with pytest.raises(MemoryError, match="device_memory_limit"):
        fit_minibatch(L, y, sw, start(), params, model_rows=L.n_hot + 1, **kw)


def test_an_out_of_core_fit_says_so_in_its_log(capsys):
    """verbose: a line says which rows stay on the device and how many
    scratch rows move the others; each epoch's line counts its windows."""
    import re

    from sklearn_cuwide._solvers import fit_minibatch
    from sklearn_cuwide._state import FitProgress

    X, y = _data(seed=13, n=700)
    L = _layout(X)
    params = StepParams(model="fm", solver="adagrad", learning_rate=0.05, l2_w=1e-3,
                        l2_v=1e-3)
    st = ModelState.zeros(X.shape[1], 1, 4, adagrad=True, init_scale=0.1, random_state=3,
                          draw=False)
    fit_minibatch(L, y, np.ones(X.shape[0]), st, params, backend=_cpu, max_iter=2,
                  shuffle=True, random_state=5, model_rows=80,
                  progress=FitProgress(verbose=1))
    out = capsys.readouterr().out
    rb = ooc.state_row_bytes(1, 4, adagrad=True)
    plan = ooc.plan_residency(L, rb, 80 * rb)
    assert (f"Out of core: the rows of the {plan.n_resident:,} most frequent of "
            f"{L.n_features:,} features stay on the device") in out
    assert f"{plan.n_slots:,} scratch rows" in out
    counts = [int(n) for n in re.findall(r"Epoch \d/2 in .*?, ([\d,]+) windows", out)]
    # the first epoch's order, drawn as the solver draws it: its windows
    rng = np.random.default_rng(5)
    bsp, tp = L.batch_sblock_ptr, L.tile_ptr
    wins = _windows(ooc.cold_sets(L, plan.n_resident), rng.permutation(L.n_batches),
                    plan.n_slots, tp[2 * bsp[1:]] - tp[2 * bsp[:-1]], plan.window_nnz)
    assert len(counts) == 2 and counts[0] == len(wins) > 1


def test_windows_bounded_by_nonzeros():
    X, _ = _data()
    L = _layout(X)
    bsp, tp = L.batch_sblock_ptr, L.tile_ptr
    batch_nnz = tp[2 * bsp[1:]] - tp[2 * bsp[:-1]]
    order = np.arange(L.n_batches)
    cap = 3 * int(batch_nnz.max())
    wins = _windows(ooc.cold_sets(L, 0), order, L.n_features, batch_nnz, cap)
    assert len(wins) > 1
    np.testing.assert_array_equal(np.concatenate([w.batches for w in wins]), order)
    for i, w in enumerate(wins):
        assert batch_nnz[w.batches].sum() <= cap
        if i + 1 < len(wins):
            assert batch_nnz[w.batches].sum() + batch_nnz[wins[i + 1].batches[0]] > cap


def test_a_prediction_whose_model_does_not_fit_runs_out_of_core():
    from sklearn_cuwide import _memory

    s = _memory.PredictShape(n_rows=10**6, n_features=2**26, nnz=39 * 10**6,
                             index_itemsize=4, value_itemsize=4, n_factors=16,
                             max_row_nnz=39)
    full = _memory.plan_predict(s, "cuda", {"host": None, "device": 2**40}, {})
    assert full.fits and full.model_rows is None
    need = full.peak("device")
    plan = _memory.plan_predict(s, "cuda", {"host": None, "device": need // 4},
                                {"host": "h", "device": "d"})
    assert plan.fits and 39 <= plan.model_rows < s.n_features
    assert plan.peak("device") <= need // 4
    # the most model rows that fit
    more = _memory.predict_needs(replace(s, model_rows=plan.model_rows + 1), "cuda")
    assert sum(more["device"]["prediction"].values()) > need // 4


def test_out_of_core_decision_values_equal_the_resident_ones():
    from sklearn_cuwide._base import _decision_values, _decision_values_out_of_core

    X, _ = _data(seed=21, n=400)
    rng = np.random.default_rng(1)
    heads = [(rng.normal(size=(X.shape[1], 1)).astype(np.float32),
              np.array([0.1], dtype=np.float32),
              rng.normal(size=(X.shape[1], 3)).astype(np.float32)) for _ in range(2)]
    ref = _decision_values(_cpu, X, heads)
    got = _decision_values_out_of_core(_cpu, X, heads, int(np.diff(X.indptr).max()) + 5)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


def test_out_of_core_fit_restores_the_best_epoch_as_the_resident_fit(monkeypatch):
    from sklearn_cuwide import _solvers

    X, y = _data(seed=17, n=700)
    L = _layout(X)
    sw = np.ones(X.shape[0])
    params = StepParams(model="fm", solver="adagrad", learning_rate=0.05, l2_w=1e-3,
                        l2_v=1e-3)

    def start():
        return ModelState.zeros(X.shape[1], 1, 4, adagrad=True, init_scale=0.1,
                                random_state=3, draw=False)

    # validation losses made up: the second of three epochs is the best
    def scripted():
        it = iter([0.5, 0.4, 0.6])
        return lambda *a, **k: next(it)

    Xv, yv = _data(seed=18, n=100)
    kw = dict(backend=_cpu, max_iter=3, random_state=5,
              validation=(Xv.tocsr(), yv.astype(np.float64), np.ones(100)))
    monkeypatch.setattr(_solvers, "_validation_loss", scripted())
    ref = _solvers.fit_minibatch(L, y, sw, start(), params, **kw)
    monkeypatch.setattr(_solvers, "_host_validation_loss", scripted())
    got = _solvers.fit_minibatch(L, y, sw, start(), params, model_rows=80, **kw)
    two = _solvers.fit_minibatch(L, y, sw, start(), params, model_rows=80,
                                 **{**kw, "max_iter": 2, "validation": None})
    for name, a in ref[0].arrays().items():
        np.testing.assert_array_equal(getattr(got[0], name), a, err_msg=name)
        np.testing.assert_array_equal(getattr(two[0], name), a, err_msg=name)
