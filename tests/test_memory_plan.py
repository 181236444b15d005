"""The memory planner (sklearn_cuwide._memory): its arithmetic against
arrays actually built, and the fits and predictions it refuses (on the CPU,
with a made-up availability, and one absurd request for real) before they
allocate, with the estimator left as it was."""

import threading
import tracemalloc

import math

import numpy as np
import pytest
from dataclasses import replace
import scipy.sparse as sp

from sklearn_cuwide import (
    GPUFactorizationMachine,
    GPUFactorizationMachineRegressor,
    GPULogisticRegression,
    InsufficientMemoryError,
)
from sklearn_cuwide import _memory
from sklearn_cuwide import _out_of_core as ooc
from sklearn_cuwide._backends import _cpu
from sklearn_cuwide._layout import LayoutTiler, build_layout, plan_layout
from sklearn_cuwide._state import ModelState

from .conftest import make_sparse_problem


def _canonical(n, d, density, seed):
    rng = np.random.default_rng(seed)
    X = sp.random(n, d, density=density, format="csr", random_state=rng, dtype=np.float32)
    X.sum_duplicates()
    return X


# --------------------------------------------------------------------------
# the arithmetic against built arrays
# --------------------------------------------------------------------------
@pytest.mark.parametrize("n, batch_size, sample_block", [
    (1, 1, 1), (1000, 64, 64), (1000, 64, 30), (1001, 1024, 342), (4097, 256, 100),
    (333, 1000, 2000),
])
@pytest.mark.parametrize("shuffle", [False, True])
def test_layout_bytes_equal_the_built_layout(n, batch_size, sample_block, shuffle):
    X = _canonical(n, 97, 0.05, n)
    L = build_layout(X, batch_size=batch_size, sample_block=sample_block, shuffle=shuffle,
                     random_state=0, n_hot_max=10)
    assert _memory.layout_blocks(n, batch_size, sample_block) == (L.n_batches, L.n_sblocks)
    assert _memory.layout_bytes(X.nnz, n, batch_size, sample_block) == L.nbytes
    L64 = build_layout(X, batch_size=batch_size, sample_block=sample_block,
                       dtype=np.float64)
    assert _memory.layout_bytes(X.nnz, n, batch_size, sample_block, 8) == L64.nbytes


@pytest.mark.parametrize("d, D, k", [(1, 1, 0), (1000, 1, 0), (1000, 7, 0), (513, 1, 16)])
@pytest.mark.parametrize("adagrad", [False, True])
def test_state_bytes_equal_the_arrays(d, D, k, adagrad):
    st = ModelState.zeros(d, D, k, adagrad=adagrad, dtype=np.float32, init_scale=0.1)
    actual = sum(a.nbytes for a in st.arrays().values())
    assert _memory.state_bytes(d, D, k, adagrad) == actual


def test_csr_bytes_equal_scipy():
    X = _canonical(500, 300, 0.02, 1)
    assert _memory.csr_bytes(X.nnz, X.shape[0], X.indices.itemsize, X.data.itemsize,
                             X.indptr.itemsize) == (X.data.nbytes + X.indices.nbytes
                                                    + X.indptr.nbytes)


@pytest.mark.parametrize("chunk_nnz", [50, 700, 5000, 10**6])
def test_chunks_stay_within_their_bound(chunk_nnz):
    rng = np.random.default_rng(3)
    X = _canonical(3000, 211, 0.03, 3)
    X = sp.lil_matrix(X)
    X[rng.integers(0, 3000, 20)] = 1.0  # a few long rows
    X = sp.csr_matrix(X)
    longest = int(np.diff(X.indptr).max())
    plan = plan_layout(X, batch_size=64, chunk_nnz=chunk_nnz, shuffle=True, random_state=0)
    bound, _, _ = _memory.chunk_bounds(X.nnz, 3000, 64, longest, chunk_nnz)
    assert max(plan.chunk_nnz(k) for k in range(len(plan.chunks))) <= bound


@pytest.mark.parametrize("n, d", [(2000, 5000), (20000, 5000)])
def test_tiling_bytes_bound_the_sort_measured(n, d):
    """The traced peak of one chunk's sort and store (numpy registers its
    allocations with tracemalloc) stays within tiling_bytes, which is not a
    loose bound either."""
    X = _canonical(n, d, 0.01, 4)
    plan = plan_layout(X, batch_size=512, sample_block=200, chunk_nnz=X.nnz,
                       shuffle=True, random_state=0)
    assert len(plan.chunks) == 1
    tiler = LayoutTiler(plan, np, np.float32)
    indptr, indices, data = plan.read_chunk(0)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        tiler.store(tiler.sort(0, indptr, indices, data))
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    bound = _memory.tiling_bytes(X.nnz, chunk_sblocks=plan.n_sblocks)
    assert peak <= bound
    assert peak >= 0.9 * bound


def test_device_budget():
    free, total = 10 * 2**30, 80 * 2**30
    assert _memory.device_budget(None, free, total)[0] == int(0.8 * free)
    # a limit's plan leaves a 16th of it free (at most 256 MiB): what the
    # device takes beside the pool's count
    assert _memory.device_budget(2**30, free, total) == (
        2**30 - 2**26, "device_memory_limit=1073741824 (1.00 GiB) less 64.00 MiB kept for "
        "what the device takes beside the plan")
    assert _memory.device_budget(2**35, 2**40, total)[0] == 2**35 - 2**28
    b, how = _memory.device_budget(2**40, free, total)
    assert b == free and "below device_memory_limit" in how
    tenth = int(0.1 * total)
    assert _memory.device_budget(0.1, free, total)[0] == tenth - min(2**28, tenth // 16)
    assert _memory.device_budget(0.5, free, total)[0] == free  # more than is free
    # an int of a few bytes, likely meant as a fraction: the words say so
    assert _memory.device_budget(1, free, total) == (1, (
        "device_memory_limit=1 (1 bytes; an int is a number of bytes, a float in (0, 1] a "
        "fraction of the device)"))


@pytest.mark.parametrize("budget", [0, 1, 31, 32, 33, 1000, 2**20 + 7, 2**31 + 5, 2**36])
def test_limit_for_budget_is_the_least_limit_with_that_budget(budget):
    lim = _memory.limit_for_budget(budget)
    room = 2**40
    assert _memory.device_budget(lim, room, room)[0] >= budget
    assert lim == 0 or _memory.device_budget(lim - 1, room, room)[0] < budget


def test_host_available_bytes(monkeypatch):
    avail = _memory.host_available_bytes()
    assert avail is None or avail > 0
    import builtins

    real_open = builtins.open

    def no_proc(path, *a, **k):
        if str(path) == "/proc/meminfo":
            raise OSError("no /proc")
        return real_open(path, *a, **k)

    monkeypatch.setattr(builtins, "open", no_proc)
    fallback = _memory.host_available_bytes()
    assert fallback is None or fallback > 0


# --------------------------------------------------------------------------
# the plans of the CUDA backend (pure arithmetic)
# --------------------------------------------------------------------------
def _shape(**kw):
    base = dict(n_rows=10**6, n_features=2**20, nnz=39 * 10**6, max_row_nnz=39,
                index_itemsize=4, value_itemsize=4, n_factors=16, solver="adagrad",
                batch_size=1024, sample_block=512)
    base.update(kw)
    return _memory.FitShape(**base)


def test_the_held_out_rows_of_a_staged_fit_are_not_copied_on_the_host():
    """Early stopping's held-out rows: a fresh fit whose layout is built from
    the whole upload of a host matrix gathers them on the device (the host
    keeps the split's marks); a continued fit, a layout planned on the host
    and a matrix on the device keep their copies where they were."""
    s = _shape(validation_fraction=0.1, warm=False)
    n_val, nnz_val = 10**5, int(math.ceil(0.1 * s.nnz))
    held = _memory.csr_bytes(nnz_val, n_val, 4, 4)

    def host(shape, csr_whole):
        return _memory.fit_needs(shape, "cuda", "device", csr_whole=csr_whole)["host"]

    staged = host(s, True)["training"]
    assert staged["the early-stopping split's marks"] == s.n_rows
    assert not any("copies of the held-out rows" in k or "layout's feature order" in k
                   for k in staged)
    for other in (host(s, False), host(replace(s, warm=True), True)):
        parts = other["training"]
        assert parts["the early-stopping split's copies of the held-out rows"] == (
            2 * held + s.n_rows)
    device = _memory.fit_needs(s, "cuda", "device", csr_whole=True)["device"]
    assert device["training"]["the held-out rows on the device"] == 2 * held
    on_device = host(replace(s, on_device=True), True)["training"]
    assert "the early-stopping split's marks" not in on_device


def test_a_fresh_model_starts_as_its_weights(monkeypatch):
    """A fresh fit's starting state is its weights and their sums (zeros):
    its factors are drawn where it trains; a continued fit starts from a
    whole copy of the model.  The estimators say which."""
    key = "a model's starting, working and fitted states"
    s = _shape()
    d = s.n_features
    got = {w: _memory.fit_needs(replace(s, warm=w), "cuda", "device")["host"]["training"][key]
           for w in (False, True)}
    whole = _memory.state_bytes(d, 1, 16, adagrad=True)
    assert got[True] == 3 * whole
    assert got[False] == 2 * whole + _memory.state_bytes(d, 1, 0, adagrad=True)
    X, y = make_sparse_problem(2, n_samples=300, n_features=200, density=0.05)
    seen = []
    real = _memory.plan_fit
    monkeypatch.setattr(_memory, "plan_fit", lambda sh, *a, **k: seen.append(sh.warm)
                        or real(sh, *a, **k))
    fm = GPUFactorizationMachine(device="cpu", n_factors=4, max_iter=1).fit(X, y)
    fm.partial_fit(X, y)
    fm.set_params(warm_start=True).fit(X, y)
    fm.set_params(warm_start=False).fit(X, y)
    lr = GPULogisticRegression(device="cpu", solver="adagrad", max_iter=1).fit(X, y)
    lr.partial_fit(X, y)
    assert seen == [False, True, True, False, False, True]


def test_cuda_plan_takes_the_first_layout_that_fits():
    s = _shape()
    peaks = {lay: _memory.MemoryPlan("fit", "cuda", lay, _memory.fit_needs(s, "cuda", lay),
                                     {}, {}, True).peak("device")
             for lay in ("device", "uploaded", "streamed")}
    assert peaks["device"] > peaks["uploaded"] > peaks["streamed"]
    layout = _memory.layout_bytes(s.nnz, s.n_rows, s.batch_size, s.sample_block)
    state = _memory.state_bytes(s.n_features, 1, 16, True)
    assert peaks["uploaded"] >= layout + state
    how = {"host": "h", "device": "d"}
    for lay, avail in (("device", peaks["device"]), ("uploaded", peaks["device"] - 1),
                       ("streamed", peaks["uploaded"] - 1)):
        plan = _memory.plan_fit(s, "cuda", {"host": None, "device": avail}, how)
        assert plan.fits and plan.layout == lay
        assert plan.layout_resident == (lay != "streamed")
    plan = _memory.plan_fit(s, "cuda", {"host": None, "device": peaks["streamed"] - 1}, how)
    if _memory.least_model_rows(s) < s.n_features:  # out of core beyond the streamed
        least = _peak_device(replace(s, model_rows=_memory.least_model_rows(s)), "streamed")
        plan = _memory.plan_fit(s, "cuda", {"host": None,
                                            "device": min(least, peaks["streamed"]) - 1}, how)
    assert not plan.fits
    with pytest.raises(InsufficientMemoryError, match="of GPU memory") as e:
        plan.check()
    msg = str(e.value)
    assert "n_factors=" in msg and "device_memory_limit" in msg and "(d)" in msg


def test_a_streamed_layout_is_tiled_on_the_gpu_where_a_chunk_fits():
    """A streamed plan of a host matrix tiles its layout on the GPU into
    pinned host memory in the largest chunk whose build phase fits the
    budget (and the next larger one does not); on a budget below the
    smallest chunk's build, or for a cupyx matrix, it is built on the host."""
    s = _shape()
    how = {"host": "h", "device": "d"}
    streamed = _peak_device(s, "streamed")
    assert streamed < _peak_device(s, "uploaded")
    for avail in (streamed, streamed + (200 << 20), _peak_device(s, "uploaded") - 1):
        plan = _memory.plan_fit(s, "cuda", {"host": None, "device": avail}, how)
        assert plan.layout == "streamed" and plan.fits and plan.model_rows is None
        chunk = plan.build_chunk_nnz
        assert chunk in _memory.STREAM_BUILD_CHUNKS
        assert "layout build" in plan.needs["device"] and plan.peak("device") <= avail
        build = _memory.fit_needs(s, "cuda", "streamed", build_chunk_nnz=chunk)
        assert plan.needs == build
        if chunk != _memory.STREAM_BUILD_CHUNKS[0]:
            larger = _memory.fit_needs(s, "cuda", "streamed", build_chunk_nnz=2 * chunk)
            assert sum(larger["device"]["layout build"].values()) > avail
    # a model out of core on a budget below the smallest chunk's build (its
    # feature ranks alone take 8 bytes a feature): built on the host
    wide = _shape(n_features=2**26)
    rows = _memory.least_model_rows(wide)
    avail = _peak_device(replace(wide, model_rows=rows), "streamed")
    smallest = _memory.fit_needs(replace(wide, model_rows=rows), "cuda", "streamed",
                                 build_chunk_nnz=_memory.STREAM_BUILD_CHUNKS[-1])
    assert sum(smallest["device"]["layout build"].values()) > avail
    plan = _memory.plan_fit(wide, "cuda", {"host": None, "device": avail}, how)
    assert plan.fits and plan.layout == "streamed" and plan.model_rows is not None
    assert plan.build_chunk_nnz is None and "layout build" not in plan.needs["device"]
    on_device = replace(s, on_device=True)
    plan = _memory.plan_fit(on_device, "cuda", {"host": None, "device": streamed}, how)
    assert plan.layout == "streamed" and plan.build_chunk_nnz is None


def test_a_device_layout_of_host_input_counts_its_csr_when_uploaded_whole():
    """The GPU build from host input either uploads the CSR whole (fastest;
    it holds the CSR beside the layout) or plans on the host and uploads
    chunks: the plan counts the one the build then takes
    (``MemoryPlan.csr_whole``, which the CUDA backend's build follows)."""
    s = _shape()
    how = {"host": "h", "device": "d"}
    whole = _memory.fit_needs(s, "cuda", "device", csr_whole=True)["device"]
    chunks = _memory.fit_needs(s, "cuda", "device")["device"]
    csr = _memory.csr_bytes(s.nnz, s.n_rows, 4, 4)
    assert whole["layout build"]["X uploaded whole"] == csr
    assert chunks["layout build"]["X uploaded whole"] == 0
    peak_whole, peak_chunks = _memory._peak(whole)[0], _memory._peak(chunks)[0]
    assert peak_whole > peak_chunks + csr // 2
    for avail, csr_whole in ((peak_whole, True), (peak_whole - 1, False),
                             (peak_chunks, False)):
        plan = _memory.plan_fit(s, "cuda", {"host": None, "device": avail}, how)
        assert plan.fits and plan.layout == "device" and plan.csr_whole == csr_whole
        assert plan.peak("device") <= avail
    # cupy input is on the device already: nothing uploaded, never "whole"
    on_dev = replace(s, on_device=True)
    plan = _memory.plan_fit(on_dev, "cuda", {"host": None, "device": peak_whole}, how)
    assert plan.layout == "device" and not plan.csr_whole
    assert plan.needs["device"]["layout build"]["X uploaded whole"] == 0


def test_a_ranking_planned_on_the_device_is_counted_while_it_stays_there():
    """A layout planned on the GPU (its CSR there: uploaded whole, or cupy
    input) keeps the frequency ranking there, three int64 arrays of
    n_features, through the build and the epochs; planned on the host, the
    build holds the rank it uploads and the epochs nothing of it.  The
    state's permutation where it trains: its largest array and the order."""
    s = _shape()
    d = s.n_features
    for shape, whole, on_device in ((s, True, True), (s, False, False),
                                    (replace(s, on_device=True), False, True)):
        dev = _memory.fit_needs(shape, "cuda", "device", csr_whole=whole)["device"]
        pointers = 8 * (-(-shape.n_rows // shape.batch_size) + 1)
        assert (dev["layout build"]["the feature ranking and block pointers"]
                == (24 if on_device else 8) * d + pointers)
        assert dev["training"].get("the layout's feature ranking", 0) == (
            24 * d if on_device else 0)
        assert dev["training"]["the model state's permutation"] == 4 * d * max(
            shape.n_outputs, shape.n_factors) + 8 * d
    ooc_shape = replace(s, model_rows=d // 2)
    dev = _memory.fit_needs(ooc_shape, "cuda", "device")["device"]
    assert "the model state's permutation" not in dev["training"]  # on the host there


def test_out_of_core_penalty_factors_are_computed_before_the_model_is_placed():
    """Scaled penalties out of core: the whole layout's factors (their
    O(n_features) temporaries, on the device when the layout is there) are
    a setup phase of their own, and the training phase counts a window's
    factors, O(model rows)."""
    s = _shape(n_features=2**24, penalty_scaled=True)
    rows = 2**20
    dev = _memory.fit_needs(replace(s, model_rows=rows), "cuda", "device")["device"]
    setup, train = dev["out-of-core setup"], dev["training"]
    assert setup["the penalty factors' computation"] == 28 * s.n_features
    assert "the model state" not in setup
    # a window's penalty factors and their packed copy, the windows' counts
    # and identity order kept on the device (16), and beside them the
    # concurrent workers' shares, scales and temporaries (17; in order none)
    assert train["per-feature step factors"] == (4 + 4 + 16 + 17) * rows
    one = _memory.fit_needs(replace(s, model_rows=rows, concurrent=False), "cuda",
                            "device")["device"]
    assert one["training"]["per-feature step factors"] == (4 + 4 + 16) * rows
    # a layout on the host computes them there: nothing on the device
    host = _memory.fit_needs(replace(s, model_rows=rows), "cuda", "streamed")["device"]
    assert "out-of-core setup" not in host
    assert host["training"]["per-feature step factors"] == (4 + 4 + 16 + 17) * rows
    resident = _memory.fit_needs(s, "cuda", "streamed")["device"]
    assert "out-of-core setup" not in resident
    assert resident["training"]["per-feature step factors"] == (
        32 * s.n_features + 20 * s.n_features)


def _peak_device(shape, layout):
    return _memory.MemoryPlan("fit", "cuda", layout, _memory.fit_needs(shape, "cuda", layout),
                              {}, {}, True).peak("device")


def test_suggested_n_factors_is_the_largest_that_fits():
    # as few features as one mini-batch may touch: no model out of core
    narrow = dict(n_features=2**15)
    s = _shape(n_factors=64, **narrow)
    assert _memory.least_model_rows(s) == s.n_features
    how = {"host": "h", "device": "d"}
    avail = {"host": None, "device": _peak_device(_shape(n_factors=20, **narrow), "streamed")}
    plan = _memory.plan_fit(s, "cuda", avail, how)
    assert not plan.fits
    k = int(next(x for x in plan.suggestions if x.startswith("n_factors=")).split("=")[1]
            .split()[0])
    assert k >= 20
    assert _memory.plan_fit(_shape(n_factors=k, **narrow), "cuda", avail, how).fits
    assert not _memory.plan_fit(_shape(n_factors=k + 1, **narrow), "cuda", avail, how).fits


@pytest.mark.parametrize("n_factors", [0, 8])
@pytest.mark.parametrize("validation_fraction", [None, 0.1])
@pytest.mark.parametrize("sample_block", [256, 1024])
def test_a_small_wide_model_still_trains_out_of_core(n_factors, validation_fraction,
                                                     sample_block):
    """20000 rows of 12 nonzeros, 2^18 features (the GPU out-of-core tests'
    data): below every whole-model placement's peak, an out-of-core plan
    fits; its allowance for the cold sets' runs is a window's layout."""
    s = _shape(n_rows=20000, n_features=2**18, nnz=240000, max_row_nnz=24,
               n_factors=n_factors, sample_block=sample_block,
               validation_fraction=validation_fraction)
    limit = min(_peak_device(s, lay) for lay in ("device", "uploaded", "streamed")) - 1
    plan = _memory.plan_fit(s, "cuda", {"host": None, "device": limit}, {"host": "h",
                                                                          "device": "d"})
    assert plan.fits and plan.model_rows is not None and plan.model_rows < s.n_features
    part = plan.needs["device"]["training"][
        "a window's layout, or the cold sets of a run of mini-batches"]
    assert part == ooc.WINDOW_BYTES_PER_NNZ * s.nnz


def test_a_model_wider_than_the_budget_trains_out_of_core():
    s = _shape(n_features=2**26)
    how = {"host": "h", "device": "d"}
    full = _peak_device(s, "streamed")
    rows = []
    for f in (0.3, 0.6, 0.9):
        avail = int(full * f)
        plan = _memory.plan_fit(s, "cuda", {"host": None, "device": avail}, how)
        assert plan.fits and plan.peak("device") <= avail
        assert _memory.least_model_rows(s) <= plan.model_rows < s.n_features
        # the most rows that fit beside that layout
        assert _peak_device(replace(s, model_rows=plan.model_rows + 1), plan.layout) > avail
        rows.append(plan.model_rows)
    assert rows[0] < rows[1] < rows[2]
    # a resident layout first, when the out-of-core model leaves room for it
    roomy = _peak_device(replace(s, model_rows=s.n_features // 4), "device")
    assert roomy < full
    plan = _memory.plan_fit(s, "cuda", {"host": None, "device": roomy}, how)
    assert plan.layout == "device" and plan.model_rows >= s.n_features // 4


def test_lbfgs_plan_counts_the_vectors():
    s = _shape(solver="lbfgs", n_factors=0, n_outputs=3)
    needs = _memory.fit_needs(s, "cpu")
    vec = needs["host"]["training"]["L-BFGS's vectors"]
    assert vec == (2 * 10 + 8) * 8 * (s.n_features * 3 + 3) + 24 * s.n_rows


# --------------------------------------------------------------------------
# fits and predictions on the CPU
# --------------------------------------------------------------------------
ESTIMATORS = [
    lambda: GPULogisticRegression(device="cpu", solver="adagrad", max_iter=2),
    lambda: GPULogisticRegression(device="cpu", solver="lbfgs", max_iter=5),
    lambda: GPUFactorizationMachine(device="cpu", n_factors=8, max_iter=2, random_state=0),
    lambda: GPUFactorizationMachineRegressor(device="cpu", n_factors=8, max_iter=2,
                                             random_state=0),
]


def _fitted_state(est):
    return {k: (v.copy() if isinstance(v, np.ndarray) else v)
            for k, v in vars(est).items() if k.endswith("_") and not k.startswith("_")}


@pytest.mark.parametrize("make", ESTIMATORS)
def test_refused_fit_leaves_the_estimator_as_it_was(make, monkeypatch):
    X, y = make_sparse_problem(3, n_samples=300, n_features=50)
    est = make()
    if isinstance(est, GPUFactorizationMachineRegressor):
        y = y.astype(float)
    est.fit(X, y)
    before = _fitted_state(est)
    monkeypatch.setattr(_memory, "host_available_bytes", lambda: 50_000)
    X2, y2 = make_sparse_problem(3, n_samples=2000, n_features=50, seed=1)
    if isinstance(est, GPUFactorizationMachineRegressor):
        y2 = y2.astype(float)
    with pytest.raises(InsufficientMemoryError, match="of host memory") as e:
        est.fit(X2, y2)
    assert "more than the 48.83 KiB available (the host's available memory)" in str(e.value)
    after = _fitted_state(est)
    assert after.keys() == before.keys()
    for k in before:
        if isinstance(before[k], np.ndarray):
            np.testing.assert_array_equal(after[k], before[k])
        else:
            assert after[k] == before[k]


def test_fit_fits_exactly_at_its_planned_need(monkeypatch):
    """The plan's host peak as the availability fits; one byte less refuses."""
    X, y = make_sparse_problem(2, n_samples=500, n_features=80)
    seen = []
    real = _memory.plan_fit

    def spy(*a, **k):
        plan = real(*a, **k)
        seen.append(plan)
        return plan

    monkeypatch.setattr(_memory, "plan_fit", spy)
    GPUFactorizationMachine(device="cpu", n_factors=4, max_iter=1).fit(X, y)
    need = seen[-1].peak("host")
    monkeypatch.setattr(_memory, "host_available_bytes", lambda: need)
    GPUFactorizationMachine(device="cpu", n_factors=4, max_iter=1).fit(X, y)
    monkeypatch.setattr(_memory, "host_available_bytes", lambda: need - 1)
    with pytest.raises(InsufficientMemoryError):
        GPUFactorizationMachine(device="cpu", n_factors=4, max_iter=1).fit(X, y)


def test_refusal_suggests_n_factors_that_fit(monkeypatch):
    X, y = make_sparse_problem(2, n_samples=400, n_features=3000, density=0.01)
    seen = []
    real = _memory.plan_fit
    monkeypatch.setattr(_memory, "plan_fit", lambda *a, **k: seen.append(real(*a, **k))
                        or seen[-1])
    # 20 factors: the training phase, which the factors change, is the peak
    GPUFactorizationMachine(device="cpu", n_factors=20, max_iter=1).fit(X, y)
    assert max(seen[-1].needs["host"].items(),
               key=lambda kv: sum(kv[1].values()))[0] == "training"
    monkeypatch.setattr(_memory, "host_available_bytes", lambda: seen[-1].peak("host"))
    with pytest.raises(InsufficientMemoryError, match=r"n_factors=\d+ \(at most\)") as e:
        GPUFactorizationMachine(device="cpu", n_factors=60, max_iter=1).fit(X, y)
    k = int(str(e.value).split("n_factors=")[1].split()[0])
    assert 8 <= k < 60  # 20 fitted with the larger sample blocks of fewer factors
    GPUFactorizationMachine(device="cpu", n_factors=k, max_iter=1).fit(X, y)


def test_absurd_model_is_refused_before_it_is_allocated():
    """An FM on 2**33 columns with 64 factors (terabytes of parameters), from
    a sparse matrix of a few nonzeros: the planned error, with next to
    nothing allocated, never the operating system's kill."""
    rng = np.random.default_rng(0)
    n = 300
    X = sp.csr_matrix((np.ones(900), (rng.integers(0, n, 900), rng.integers(0, 2**33, 900))),
                      shape=(n, 2**33))
    y = np.arange(n) % 2
    tracemalloc.start()
    try:
        with pytest.raises(InsufficientMemoryError, match="TiB of host memory") as e:
            GPUFactorizationMachine(device="cpu", n_factors=64).fit(X, y)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50 * 2**20
    assert "fewer features" in str(e.value)


def test_prediction_is_planned_and_refused_with_rows_per_call(monkeypatch):
    X, y = make_sparse_problem(3, n_samples=2000, n_features=40)
    fm = GPUFactorizationMachine(device="cpu", n_factors=8, max_iter=1).fit(X, y)
    expected = fm.decision_function(X)
    monkeypatch.setattr(_memory, "host_available_bytes", lambda: 100_000)
    with pytest.raises(InsufficientMemoryError, match="This prediction needs") as e:
        fm.decision_function(X)
    rows = int(str(e.value).split("at most ")[1].split()[0])
    assert 1 <= rows < 2000
    np.testing.assert_allclose(fm.decision_function(X[:rows]), expected[:rows])


def test_a_memory_error_during_a_fit_becomes_ours(monkeypatch):
    """numpy's MemoryError in the middle of a planned fit (memory taken
    meanwhile): InsufficientMemoryError chained to it, estimator unchanged."""
    X, y = make_sparse_problem(2, n_samples=300, n_features=30)
    fm = GPUFactorizationMachine(device="cpu", n_factors=4, max_iter=2).fit(X, y)
    before = _fitted_state(fm)

    def oom(*a, **k):
        np.empty(2**62, dtype=np.uint8)  # numpy's MemoryError, for real

    monkeypatch.setattr(_cpu, "run_epoch", oom)
    with pytest.raises(InsufficientMemoryError, match="ran out of memory during the fit") as e:
        fm.fit(X, y)
    assert isinstance(e.value.__cause__, MemoryError)
    assert "It was planned to need" in str(e.value)
    np.testing.assert_array_equal(fm.coef_, before["coef_"])


def test_the_plan_is_per_thread_and_ends_with_the_fit(monkeypatch):
    X, y = make_sparse_problem(2, n_samples=300, n_features=30)
    seen = {}
    real = _cpu.build_layout

    def spy(X, **kw):
        seen[kw["batch_size"]] = _memory.active_plan()
        return real(X, **kw)

    monkeypatch.setattr(_cpu, "build_layout", spy)
    threads = [threading.Thread(target=GPULogisticRegression(
        device="cpu", solver="adagrad", max_iter=1, batch_size=b).fit, args=(X, y))
        for b in (32, 64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    plans = list(seen.values())
    assert len(plans) == 2 and all(p is not None and p.layout == "host" for p in plans)
    assert plans[0] is not plans[1]
    assert _memory.active_plan() is None


# --------------------------------------------------------------------------
# an interrupted stream_chunks (the CUDA uploader, with the numpy stand-in)
# --------------------------------------------------------------------------
class _SlowHost(np.ndarray):
    """Host nonzeros whose slices take a while: the worker's fill of the
    next chunk is still running when the consumer stops."""

    filled = []

    def __getitem__(self, key):
        import time

        time.sleep(0.05)
        out = np.ndarray.__getitem__(self.view(np.ndarray), key)
        _SlowHost.filled.append(key)
        return out


@pytest.mark.parametrize("resident", [False, True])
@pytest.mark.parametrize("how", ["error", "close"])
def test_interrupted_stream_drains_its_copies(resident, how):
    """The consumer fails (or stops) after the first chunk: before the
    generator is done, the next chunk's fill has finished and the host has
    waited for every copy, so the buffers may be released."""
    from .test_gpu_upload import _FakeCupy, _upload_module

    up = _upload_module()
    L = build_layout(_canonical(2000, 300, 0.02, 5), batch_size=64, sample_block=30)
    cuts = np.linspace(0, L.nnz, 6).astype(int)
    bounds = list(zip(cuts[:-1].tolist(), cuts[1:].tolist()))
    host = tuple(a.view(_SlowHost) for a in (L.feat, L.row, L.val))
    fake = _FakeCupy()
    dev = [fake.zeros(a.shape, dtype=a.dtype) for a in host] if resident else None
    uploader = up.PinnedUploader(fake, [(max(b - a for a, b in bounds), a.dtype)
                                        for a in host], device_buffers=not resident)
    _SlowHost.filled = []
    gen = up.stream_chunks(uploader, host, bounds, list(range(5)), fake._null, resident=dev)
    next(gen)
    (copy,) = fake.streams
    assert copy.in_flight or copy.queue  # chunk 0's copy: the host has not waited
    if how == "close":
        gen.close()
    else:
        with pytest.raises(KeyboardInterrupt):
            gen.throw(KeyboardInterrupt)
    assert not copy.queue and not copy.in_flight
    assert len(_SlowHost.filled) == 2 * 3  # chunk 1's fill finished before the return
    uploader.close()


def test_a_method_out_of_memory_releases_again_once_its_frame_has_ended():
    """The device scope releases the pools while the estimator method's frame
    still holds its arrays; ``releases_memory`` releases again when that
    frame has ended: by then its arrays are gone, those in reference cycles
    too."""
    import weakref

    from sklearn_cuwide._base import releases_memory

    class Array:  # stands for a device array the method holds
        pass

    seen = []

    class Est:
        @releases_memory
        def fit(self, X):
            held = Array()
            held.me = held  # in a reference cycle: freed by the collector only
            self.ref = weakref.ref(held)
            err = _memory.InsufficientMemoryError("the GPU ran out of memory")
            err._release = lambda: seen.append(self.ref() is None)
            raise err

        @releases_memory
        def predict(self, X):
            raise _memory.InsufficientMemoryError("planned: does not fit")

    est = Est()
    with pytest.raises(_memory.InsufficientMemoryError, match="ran out"):
        est.fit(None)
    assert seen == [True]  # released once, after the array was freed
    with pytest.raises(_memory.InsufficientMemoryError, match="planned"):
        est.predict(None)  # a refusal before allocating: nothing to release
    assert seen == [True]


def test_a_model_wider_than_the_device_budget_is_not_cached_there():
    """After a fit, the fitted model is kept on the device for predictions
    only when it fits the budget under device_memory_limit (a model trained
    out of core is not uploaded whole afterwards), the pool's cached blocks
    given back first; else no cache, and the predictions plan their own
    memory.  (A stand-in device backend.)"""
    import types

    import scipy.sparse as sp

    from sklearn_cuwide import GPUFactorizationMachine, config_context
    from sklearn_cuwide._backends import _cpu

    X = sp.random(200, 50, density=0.2, format="csr", random_state=0)
    y = np.arange(200) % 2
    est = GPUFactorizationMachine(n_factors=4, max_iter=2, device="cpu").fit(X, y)
    uploads, released = [], []
    dev = types.SimpleNamespace(
        name="stand-in", device_memory=lambda: (10**9, 2 * 10**9),
        to_device=lambda a: uploads.append(a.nbytes) or a,
        release_cached=lambda: released.append(len(uploads)))
    need = sum(a.nbytes for h in est._heads() for a in h if a is not None)
    # the least limit whose budget (the limit less its reserve) holds the model
    least = next(lim for lim in range(need, 2 * need)
                 if _memory.device_budget(lim, *dev.device_memory())[0] >= need)
    with config_context(device_memory_limit=least - 1):
        est._set_gpu_cache(dev)
    assert uploads == [] and "_gpu_cache" not in est.__dict__
    with config_context(device_memory_limit=least):
        est._set_gpu_cache(dev)
    assert sum(uploads) == need and est._valid_gpu_cache(dev) is not None
    # the fit's cached blocks were given back before the model went in
    assert released == [0]
    est._set_gpu_cache(_cpu)  # the CPU: the arrays themselves, always
    assert est._valid_gpu_cache(_cpu) is not None


class _Held:
    """A stand-in device array: its bytes count as held on the device until
    read back (``np.asarray``), as ``_cuda._runtime.DeviceArray``'s do."""

    def __init__(self, a):
        self.a, self.read = a, False

    @property
    def nbytes(self):
        return 0 if self.read else self.a.nbytes

    def __array__(self, dtype=None, copy=None):
        self.read = True
        return self.a


def test_the_fits_device_arrays_become_the_cache_and_its_sums_stay_when_they_fit():
    """A GPU fit's own device model becomes the prediction cache (only the
    intercepts copied), and Adagrad's sums it left on the device stay there
    when model and sums fit the budget, the budget counting what they hold
    as free; the sums are read back when only the model fits, and both when
    neither does.  (A stand-in device backend.)"""
    import types

    import scipy.sparse as sp

    from sklearn_cuwide import GPUFactorizationMachine, config_context
    from sklearn_cuwide._minibatch import HeadResult

    X = sp.random(200, 50, density=0.2, format="csr", random_state=0)
    y = np.arange(200) % 2
    est = GPUFactorizationMachine(n_factors=4, max_iter=2, device="cpu").fit(X, y)
    (w, b, V), = est._heads()
    dev_w, dev_V = _Held(w.copy()), _Held(V.copy())
    model = dev_w.nbytes + b.nbytes + dev_V.nbytes
    uploads = []
    free = 10**9
    dev = types.SimpleNamespace(
        name="stand-in", device_memory=lambda: (free, 2 * 10**9),
        to_device=lambda a: uploads.append(a.nbytes) or a,
        release_cached=lambda: None)
    results = [HeadResult(None, 2, [], device_model=(dev_w, dev_V))]

    def fitted(limit):
        uploads.clear()
        dev_w.read = dev_V.read = False
        sums = {"gw": _Held(np.ones_like(w)), "gV": _Held(np.ones_like(V)), "gb": None}
        est._optimizer_state = [sums]
        with config_context(device_memory_limit=limit):
            est._set_gpu_cache(dev, results)
        return sums

    def least(need):
        return next(lim for lim in range(need, 2 * need)
                    if _memory.device_budget(lim, *dev.device_memory())[0] >= need)

    sums = fitted(least(model + w.nbytes + V.nbytes))
    heads = est._valid_gpu_cache(dev)
    assert heads[0][0] is dev_w and heads[0][2] is dev_V and uploads == [b.nbytes]
    assert est._optimizer_state[0] is sums and sums["gV"].nbytes == V.nbytes
    # the budget counts the fit's held arrays as free: they all stay where
    # the free memory alone would not hold them (without a limit, a share
    # of the free memory is the budget)
    held = 2 * (w.nbytes + V.nbytes)
    free = -(-(held + b.nbytes) * 10**6 // int(_memory.DEFAULT_FREE_FRACTION * 10**6)) - held
    assert _memory.device_budget(None, free, 2 * 10**9)[0] < held + b.nbytes
    sums = fitted(None)
    assert est._valid_gpu_cache(dev)[0][0] is dev_w and est._optimizer_state[0] is sums
    free = 10**9
    sums = fitted(least(model + w.nbytes + V.nbytes) - 1)  # the model alone fits
    assert est._valid_gpu_cache(dev)[0][0] is dev_w
    saved = est._optimizer_state[0]
    assert isinstance(saved["gV"], np.ndarray) and sums["gV"].read and saved["gb"] is None
    np.testing.assert_array_equal(saved["gV"], np.ones_like(V))
    sums = fitted(least(model) - 1)  # nothing fits: no cache, the sums read back
    assert "_gpu_cache" not in est.__dict__ and uploads == []
    assert isinstance(est._optimizer_state[0]["gw"], np.ndarray)


def test_out_of_core_host_bookkeeping_bounds_what_it_takes_measured():
    """The host part of an out-of-core fit's bookkeeping, traced (numpy
    registers its allocations with tracemalloc): the cold sets found, the
    window statistics made, every window of an epoch cut and its layout made
    on the host (a layout built there), within what the plan counts."""
    from sklearn_cuwide._layout import build_layout

    rng = np.random.default_rng(0)
    n, d, per_row = 20000, 50000, 8
    cols = np.minimum(rng.zipf(1.2, size=n * per_row) - 1, d - 1)
    X = sp.csr_matrix((np.ones(n * per_row, dtype=np.float32),
                       (np.repeat(np.arange(n), per_row), cols)), shape=(n, d))
    X.sum_duplicates()
    L = build_layout(X, batch_size=256, sample_block=128, shuffle=True, random_state=0)
    rb = ooc.state_row_bytes(1, 4, adagrad=True)
    rows = 6000
    s = _shape(n_rows=n, n_features=d, nnz=X.nnz, max_row_nnz=per_row, n_factors=4,
               batch_size=256, sample_block=128, penalty_scaled=True, model_rows=rows)
    host = _memory.fit_needs(s, "cuda", "streamed")["host"]["training"]
    bound = (host["the out-of-core bookkeeping"]
             + host["a window's layout, or the cold sets of a run of mini-batches"])
    penalty = np.ones(d)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        plan = ooc.plan_residency(L, rb, rows * rb)
        sets = ooc.cold_sets(L, plan.n_resident, max_nnz=ooc.cold_sets_run_nnz(plan.window_nnz))
        stats = ooc.WindowStats(L, plan.n_resident, plan.n_slots, penalty.astype(np.float32))
        bsp, tp = L.batch_sblock_ptr, L.tile_ptr
        batch_nnz = tp[2 * bsp[1:]] - tp[2 * bsp[:-1]]
        order = rng.permutation(L.n_batches)
        n_windows = 0
        for w in ooc.plan_windows(sets, order, plan.n_slots, batch_nnz, plan.window_nnz):
            sub, lrows = ooc.window_layout(L, w, plan.n_resident, plan.n_slots, stats=stats)
            del sub, lrows
            n_windows += 1
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert n_windows > 1 and plan.out_of_core
    # the whole layout's penalty factors (float64, the caller's) are counted too
    assert peak <= bound, (peak, bound)


def test_an_in_order_fm_counts_its_kernels_scratch():
    """An FM trained in order (its ``"auto"``) counts the in-order kernel's
    scratch on the device, as ``InOrderScratch`` allocates it (two sample
    blocks of per-sample sums, the hot features' gradients and flags, two
    intercept gradients and the barrier's word); a
    concurrent FM and logistic regression have none.  The plan's limits are
    the layout's (``_tiles``)."""
    from sklearn_cuwide._backends import _tiles

    assert (_memory.MAX_HOT, _memory.MAX_SAMPLE_BLOCK) == (_tiles.MAX_HOT,
                                                           _tiles.MAX_SAMPLE_BLOCK)

    def scratch(shape):
        train = _memory.fit_needs(shape, "cuda", "device", csr_whole=True)["device"]["training"]
        return train.get("the in-order kernel's scratch")

    s = _shape(sample_block=1024, concurrent=False)
    rs = _tiles.in_order_row_stride(16)
    assert rs == 20  # 16 sums, padded to 16 bytes for the vector atomics
    assert scratch(s) == 4 * (2 * 1024 * rs + _tiles.MAX_HOT * (17 + 2) + 3)
    small = replace(s, n_features=1000)  # at most every feature hot
    assert scratch(small) == 4 * (2 * 1024 * rs + 1000 * (17 + 2) + 3)
    assert scratch(replace(s, concurrent=True)) is None
    assert scratch(replace(s, n_factors=0)) is None
