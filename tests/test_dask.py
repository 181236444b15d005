"""sklearn_cuwide.dask on a CPU LocalCluster, against the single-process CPU
fit: L-BFGS gives the same coefficients; the mini-batch solvers give the
per-partition epochs averaged by rows (a reference built here from the
single-process solver), and with one partition the single-process fit
itself.  NCCL tests are marked gpu (they need two GPUs and dask_cuda)."""

import numpy as np
import pytest
import scipy.sparse as sp

distributed = pytest.importorskip(
    "distributed", reason="dask.distributed is not installed (pip install "
    "'sklearn-cuwide[dask]')")
da = pytest.importorskip("dask.array")

import sklearn_cuwide as local_api  # noqa: E402
from sklearn_cuwide import dask as dask_api  # noqa: E402
from sklearn_cuwide._backends import _cpu  # noqa: E402
from sklearn_cuwide._base import _check_fit_data  # noqa: E402
from sklearn_cuwide._device import cuda_device_count  # noqa: E402
from sklearn_cuwide._fm import _standardise, _target_scaling  # noqa: E402
from sklearn_cuwide._minibatch import COMPUTE_DTYPE, _seeds  # noqa: E402
from sklearn_cuwide._solvers import fit_minibatch  # noqa: E402
from sklearn_cuwide._state import ModelState  # noqa: E402

from .conftest import make_sparse_problem  # noqa: E402

ROWS = 600
CHUNK = 150  # four chunks: two per worker
#: unequal chunks: the first worker gets the first two (450 rows), the second
#: the last (150): the averages are weighted
UNEQUAL = (250, 200, 150)


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1,
                                       processes=False, dashboard_address=None)
    # not the default client: the test that passes none sees none
    c = distributed.Client(cluster, set_as_default=False)
    yield c
    c.close()
    cluster.close()


def _dask(X, y, chunk=CHUNK, sw=None):
    dX = da.from_array(X, chunks=(chunk, -1), asarray=False)
    dy = da.from_array(np.asarray(y), chunks=(chunk,))
    dsw = None if sw is None else da.from_array(np.asarray(sw), chunks=(chunk,))
    return dX, dy, dsw


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12)


@pytest.fixture(scope="module")
def binary():
    return make_sparse_problem(2, n_samples=ROWS, n_features=40)


@pytest.fixture(scope="module")
def multiclass():
    return make_sparse_problem(3, n_samples=ROWS, n_features=40, seed=1)


# --------------------------------------------------------------------------
# L-BFGS: the same coefficients as the single-process fit
# --------------------------------------------------------------------------
@pytest.mark.parametrize("problem", ["binary", "multiclass"])
def test_lbfgs_equals_single_process(client, problem, request):
    X, y = request.getfixturevalue(problem)
    sw = np.random.default_rng(0).uniform(0.5, 2.0, X.shape[0])
    kw = dict(C=0.7, tol=1e-9, max_iter=1000, device="cpu", class_weight="balanced")
    ref = local_api.GPULogisticRegression(**kw).fit(X, y, sample_weight=sw)
    dX, dy, dsw = _dask(X, y, sw=sw)
    est = dask_api.GPULogisticRegression(**kw, client=client).fit(dX, dy, dsw)
    assert _rel(est.coef_, ref.coef_) < 1e-4
    assert _rel(est.intercept_, ref.intercept_) < 1e-4
    loc = est.to_local()
    assert type(loc) is local_api.GPULogisticRegression
    np.testing.assert_array_equal(loc.classes_, ref.classes_)
    assert loc.n_features_in_ == X.shape[1] and loc.device_ == "cpu"
    # partition-wise prediction on the dask array is the local model's
    np.testing.assert_allclose(est.predict_proba(dX).compute(), loc.predict_proba(X))
    np.testing.assert_array_equal(est.predict(dX).compute(), loc.predict(X))
    assert np.mean(loc.predict(X) == ref.predict(X)) > 0.99


def test_lbfgs_from_scipy_matrix_and_current_client(client, binary):
    """A scipy matrix is split over the workers; the current client is used
    when none is passed."""
    X, y = binary
    ref = local_api.GPULogisticRegression(tol=1e-9, max_iter=1000, device="cpu").fit(X, y)
    with client.as_current():
        est = dask_api.GPULogisticRegression(tol=1e-9, max_iter=1000,
                                             device="cpu").fit(X, y)
    assert _rel(est.coef_, ref.coef_) < 1e-4


# --------------------------------------------------------------------------
# mini-batch solvers: per-partition epochs averaged by rows
# --------------------------------------------------------------------------
def _reference_epochs(local, X, y, sw, chunks_per_part, epochs):
    """The obvious reference: the partitions (contiguous rows, as the
    cluster gets them) trained one by one for an epoch with the
    single-process solver from the same starting state, their models and
    Adagrad's accumulators averaged weighted by rows, ``epochs`` times.
    Seeds as documented: layout ``seed_layout + k``, epochs
    ``seed_epochs + k * n_heads + head``.  Returns the fitted heads' states.

    The starting state and step parameters come from a one-partition fit of
    the single-process estimator's own training code (``fit`` with the
    data), so this reference shares no code with sklearn_cuwide.dask."""
    fitted_heads = _single_process_setup(local, X, y, sw)
    params, states, targets = fitted_heads
    n_heads = len(states)
    _, seed_layout, seed_epochs, _ = _seeds(local.random_state)
    bounds = np.cumsum([0] + [sum(c) for c in chunks_per_part])
    parts = []
    for k in range(len(chunks_per_part)):
        r = slice(bounds[k], bounds[k + 1])
        Xk = X[r]
        sb, nh = _cpu.tile_shape(params, states[0].n_outputs, states[0].n_factors,
                                 local.batch_size)
        layout = _cpu.build_layout(Xk, batch_size=local.batch_size, sample_block=sb,
                                   n_hot_max=nh, shuffle=True,
                                   random_state=seed_layout + k, dtype=COMPUTE_DTYPE)
        rngs = [np.random.default_rng(seed_epochs + k * n_heads + h)
                for h in range(n_heads)]
        parts.append((layout, [t[r] for t in targets], sw[r], rngs, Xk.shape[0]))
    n = float(X.shape[0])
    for _ in range(epochs):
        new = []
        for h in range(n_heads):
            acc = None
            for layout, ts, swk, rngs, rows in parts:
                start = ModelState(**{a: np.array(v) for a, v in states[h].arrays().items()})
                out, *_ = fit_minibatch(layout, ts[h].astype(COMPUTE_DTYPE), swk, start,
                                        params, backend=_cpu, max_iter=1, tol=None,
                                        random_state=rngs[h], workers=1)
                arrs = {a: rows * np.asarray(v, np.float64) for a, v in out.arrays().items()}
                acc = arrs if acc is None else {a: acc[a] + arrs[a] for a in acc}
            new.append(ModelState(**{a: (v / n).astype(COMPUTE_DTYPE)
                                     for a, v in acc.items()}))
        states = new
    return states


def _single_process_setup(local, X, y, sw):
    """The step parameters, starting states and targets of the
    single-process fit, captured from its own code by handing it a backend
    whose ``run_epoch`` records them and trains nothing (max_iter=1)."""
    captured = {"states": [], "targets": []}

    class Probe:
        def __getattr__(self, name):
            return getattr(_cpu, name)

        def build_layout(self, X, **kw):
            captured["layout"] = _cpu.build_layout(X, **kw)
            return captured["layout"]

        def run_epoch(self, layout, yl, swl, bw, state, params, order, **kw):
            # the starting state as the first epoch gets it (layout order)
            captured["states"].append(ModelState(**{a: np.array(v) for a, v
                                                    in state.arrays().items()}))
            captured["params"] = params
            t = np.empty_like(yl)
            t[layout.row_order] = yl  # back to the user's row order
            captured["targets"].append(t)
            return 0.0

    est = local.__class__(**{**local.get_params(), "max_iter": 1, "tol": None})
    regressor = isinstance(est, local_api.GPUFactorizationMachineRegressor)
    Xc, yc, swc = _check_fit_data(est, X, y, sw, backend=_cpu, y_numeric=regressor)
    probe = Probe()
    if isinstance(est, local_api.GPULogisticRegression):
        C, l1 = est._regularization()
        classes, y_idx = est._fit_classes(yc)
        swc = est._weights(classes, yc, swc)
        est._minibatch_attrs(Xc, y_idx, swc, C, l1, probe, None, classes, partial=False)
    elif regressor:
        # the target standardised as the regressor's fit does
        scaling = _target_scaling(yc, swc, fit_intercept=est.fit_intercept)
        est._fit_heads(Xc, [_standardise(yc, scaling)], swc, probe, None, stratify=None,
                       partial=False)
    else:
        classes, y_idx = est._fit_classes(yc)
        swc = est._weights(classes, yc, swc)
        est._fit_heads(Xc, est._targets(y_idx, classes), swc, probe, None,
                       stratify=y_idx, partial=False)
    # the states are in the layout's feature order: back to the user's
    rank = captured["layout"].feature_rank
    return (captured["params"], [s.permute_features(rank) for s in captured["states"]],
            captured["targets"])


MINIBATCH = [
    ("lr-adagrad", lambda: local_api.GPULogisticRegression(
        solver="adagrad", C=2.0, batch_size=64, max_iter=3, random_state=0,
        device="cpu"), "binary"),
    ("lr-sgd-multiclass", lambda: local_api.GPULogisticRegression(
        solver="sgd", batch_size=64, max_iter=3, random_state=1, device="cpu"),
     "multiclass"),
    ("fm-binary", lambda: local_api.GPUFactorizationMachine(
        n_factors=4, batch_size=64, max_iter=3, random_state=2, device="cpu",
        tol=None), "binary"),
    ("fm-multiclass-sgd", lambda: local_api.GPUFactorizationMachine(
        n_factors=3, solver="sgd", learning_rate=0.05, batch_size=64, max_iter=2,
        random_state=3, device="cpu", tol=None), "multiclass"),
    ("fm-regressor", lambda: local_api.GPUFactorizationMachineRegressor(
        solver="adagrad", n_factors=4, batch_size=64, max_iter=3, random_state=4,
        device="cpu", tol=None), "regression"),
]


def _problem(name, request):
    if name == "regression":
        X, _ = request.getfixturevalue("binary")
        y = np.asarray(X.sum(axis=1)).ravel() + np.random.default_rng(5).normal(
            scale=0.1, size=X.shape[0])
        return X, y
    return request.getfixturevalue(name)


def _dask_of(local, client):
    cls = getattr(dask_api, type(local).__name__)
    return cls(**local.get_params(), client=client)


def _fitted_heads(est):
    """``(w, b, V)`` per head of a fitted single-process estimator."""
    return [(np.asarray(w), np.asarray(b), V) for w, b, V in est._heads()]


@pytest.mark.parametrize("name,make,problem", MINIBATCH, ids=[m[0] for m in MINIBATCH])
def test_minibatch_is_the_averaged_partitions(client, name, make, problem, request):
    X, y = _problem(problem, request)
    sw = np.random.default_rng(6).uniform(0.5, 2.0, X.shape[0])
    local = make()
    dX, dy, dsw = _dask(X, y, chunk=UNEQUAL, sw=sw)
    est = _dask_of(local, client).fit(dX, dy, dsw)
    # two workers, three chunks: chunks 0-1 on the first, 2 on the second
    ref = _reference_epochs(local, X, y, sw, [UNEQUAL[:2], UNEQUAL[2:]], local.max_iter)
    got = est.to_local()
    assert type(got) is type(local)
    if problem == "regression":  # trained on the standardised target
        off, sc = _target_scaling(y, sw, fit_intercept=local.fit_intercept)
        for st in ref:
            st.w, st.b, st.V = st.w * sc, st.b * sc + off, st.V * np.sqrt(sc)
    for (w, b, V), st in zip(_fitted_heads(got), ref):
        np.testing.assert_allclose(w, st.w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(b, st.b, rtol=1e-5, atol=1e-6)
        if V is not None:
            np.testing.assert_allclose(V, st.V, rtol=1e-5, atol=1e-6)
    if local.solver == "adagrad":  # the accumulators are averaged too
        acc = got._optimizer_state
        acc = acc if isinstance(acc, list) else [acc]
        for a, st in zip(acc, ref):
            np.testing.assert_allclose(a["gw"], st.gw, rtol=1e-5, atol=1e-6)
    assert len(got.loss_curve_) == local.max_iter
    # the single-process estimator's predictions, partition-wise
    method = "predict" if problem == "regression" else "predict_proba"
    np.testing.assert_allclose(np.asarray(getattr(est, method)(dX).compute()),
                               getattr(got, method)(X))


@pytest.mark.parametrize("name,make,problem", MINIBATCH, ids=[m[0] for m in MINIBATCH])
def test_one_partition_is_the_single_process_fit(client, name, make, problem, request):
    X, y = _problem(problem, request)
    local = make()
    ref = local.fit(X, y)
    dX, dy, _ = _dask(X, y, chunk=X.shape[0])
    got = _dask_of(local, client).fit(dX, dy).to_local()
    for (w, b, V), (rw, rb, rV) in zip(_fitted_heads(got), _fitted_heads(ref)):
        np.testing.assert_allclose(w, rw, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(b, rb, rtol=1e-6, atol=1e-7)
        if V is not None:
            np.testing.assert_allclose(V, rV, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got.loss_curve_, ref.loss_curve_, rtol=1e-6)
    assert got.n_iter_ == ref.n_iter_


def test_auto_solver_trains_adagrad_epochs(client, request):
    """The regressor's solver="auto" is Adagrad on a cluster, where a single
    process would sample these rows (more than its parameters)."""
    X, y = _problem("regression", request)
    kw = dict(n_factors=2, batch_size=64, max_iter=2, random_state=4, device="cpu", tol=None)
    assert local_api.GPUFactorizationMachineRegressor(**kw).fit(X, y).solver_ == "mcmc"
    ref = local_api.GPUFactorizationMachineRegressor(solver="adagrad", **kw).fit(X, y)
    dX, dy, _ = _dask(X, y, chunk=X.shape[0])
    got = dask_api.GPUFactorizationMachineRegressor(client=client, **kw).fit(dX, dy)
    assert got.solver_ == "adagrad"
    np.testing.assert_allclose(got.to_local().coef_, ref.coef_, rtol=1e-6, atol=1e-7)


def _reference_rounds(local, X, y, parts_rows, epochs, sync_every):
    """The reference of ``sync_every``: each epoch's mini-batch order of
    every partition (drawn as the single-process solver draws it) cut into
    as many rounds as the largest partition has groups of ``sync_every``;
    each round, the partitions train their share with the CPU backend's
    ``run_epoch`` from the same state, one by one, and the models are
    averaged by rows.  One head (binary or regression)."""
    params, (state,), (t,) = _single_process_setup(local, X, y, np.ones(X.shape[0]))
    _, seed_layout, seed_epochs, _ = _seeds(local.random_state)
    bounds = np.cumsum([0] + list(parts_rows))
    parts = []
    for k in range(len(parts_rows)):
        r = slice(bounds[k], bounds[k + 1])
        sb, nh = _cpu.tile_shape(params, 1, state.n_factors, local.batch_size)
        L = _cpu.build_layout(X[r], batch_size=local.batch_size, sample_block=sb,
                              n_hot_max=nh, shuffle=True, random_state=seed_layout + k,
                              dtype=COMPUTE_DTYPE)
        tl = t[r][L.row_order].astype(COMPUTE_DTYPE)
        sw = np.ones(L.n_rows)
        bw = np.add.reduceat(sw, L.sblock_row_ptr[L.batch_sblock_ptr[:-1]])
        parts.append((L, tl, sw.astype(COMPUTE_DTYPE), bw,
                      np.random.default_rng(seed_epochs + k)))
    n_rounds = -(-max(L.n_batches for L, *_ in parts) // sync_every)
    for _ in range(epochs):
        orders = [rng.permutation(L.n_batches) for L, _, _, _, rng in parts]
        for q in range(n_rounds):
            acc = None
            for (L, tl, sw, bw, _), order in zip(parts, orders):
                nb = L.n_batches
                st = ModelState(**{a: np.array(v) for a, v in state.arrays().items()})
                st = st.permute_features(L.feature_order)
                _cpu.run_epoch(L, tl, sw, bw, st, params,
                               order[q * nb // n_rounds:(q + 1) * nb // n_rounds])
                st = st.permute_features(L.feature_rank)
                arrs = {a: L.n_rows * np.asarray(v, np.float64)
                        for a, v in st.arrays().items()}
                acc = arrs if acc is None else {a: acc[a] + arrs[a] for a in acc}
            state = ModelState(**{a: (v / X.shape[0]).astype(COMPUTE_DTYPE)
                                  for a, v in acc.items()})
    return state


@pytest.mark.parametrize("sync_every", [1, 3])
def test_sync_every_averages_every_k_minibatches(client, binary, sync_every):
    X, y = binary
    local = local_api.GPUFactorizationMachine(n_factors=3, batch_size=64, max_iter=2,
                                              random_state=7, device="cpu", tol=None)
    dX, dy, _ = _dask(X, y, chunk=UNEQUAL)
    est = _dask_of(local, client).set_params(sync_every=sync_every).fit(dX, dy)
    ref = _reference_rounds(local, X, y, [sum(UNEQUAL[:2]), UNEQUAL[2]], 2, sync_every)
    (w, b, V), = _fitted_heads(est.to_local())
    np.testing.assert_allclose(w, ref.w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(V, ref.V, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b, ref.b, rtol=1e-5, atol=1e-6)
    # one partition: rounds in order are the single-process epoch
    one = _dask_of(local, client).set_params(sync_every=sync_every).fit(
        *_dask(X, y, chunk=X.shape[0])[:2]).to_local()
    single = local_api.GPUFactorizationMachine(**local.get_params()).fit(X, y)
    np.testing.assert_allclose(one.factors_, single.factors_, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(one.loss_curve_, single.loss_curve_, rtol=1e-6)


def test_tol_stops_as_the_single_process_fit(client, binary):
    """The stopping rule on the global loss is the single-process fit's."""
    X, y = binary
    kw = dict(n_factors=2, max_iter=200, tol=10.0, n_iter_no_change=2, random_state=0,
              device="cpu")
    ref = local_api.GPUFactorizationMachine(**kw).fit(X, y)
    assert ref.n_iter_ < 200  # it stops early
    for chunk in (X.shape[0], CHUNK):
        dX, dy, _ = _dask(X, y, chunk=chunk)
        est = dask_api.GPUFactorizationMachine(**kw, client=client).fit(dX, dy)
        assert est.n_iter_ == ref.n_iter_ and len(est.loss_curve_) == ref.n_iter_


# --------------------------------------------------------------------------
# bad input: clear errors before any training
# --------------------------------------------------------------------------
def test_no_client(binary):
    X, y = binary
    dX, dy, _ = _dask(X, y)
    with pytest.raises(ValueError, match="needs a dask.distributed Client"):
        dask_api.GPULogisticRegression(device="cpu").fit(dX, dy)


def test_dense_chunks_refused(client, binary):
    X, y = binary
    dX = da.from_array(X.toarray(), chunks=(CHUNK, -1))
    dy = da.from_array(y, chunks=CHUNK)
    with pytest.raises(TypeError, match="scipy.sparse CSR.*map_blocks"):
        dask_api.GPULogisticRegression(device="cpu", client=client).fit(dX, dy)


def test_dense_chunks_refused_on_the_client_before_any_task(client, binary):
    """One clear error from the client, not a worker's traceback per chunk."""
    from distributed import get_task_stream

    X, y = binary
    dX = da.from_array(X.toarray(), chunks=(CHUNK, -1))
    dy = da.from_array(y, chunks=CHUNK)
    with get_task_stream(client) as ts:
        with pytest.raises(TypeError, match="chunks are dense numpy arrays.*map_blocks"):
            dask_api.GPUFactorizationMachine(device="cpu", client=client).fit(dX, dy)
    assert ts.data == []
    # CSR chunks from dask.array.from_delayed, with the meta that says so
    import dask

    parts = [da.from_delayed(dask.delayed(X[i:i + CHUNK]), shape=X[i:i + CHUNK].shape,
                             dtype=X.dtype, meta=sp.csr_matrix((0, X.shape[1])))
             for i in range(0, X.shape[0], CHUNK)]
    est = dask_api.GPULogisticRegression(solver="adagrad", max_iter=2, device="cpu",
                                         client=client)
    est.fit(da.concatenate(parts), dy)


def test_csc_chunks_refused(client, binary):
    X, y = binary
    dX = da.from_array(X, chunks=(CHUNK, -1), asarray=False).map_blocks(
        sp.csc_matrix, dtype=X.dtype)
    dy = da.from_array(y, chunks=CHUNK)
    with pytest.raises(TypeError, match=r"chunk \d+ is a csc_matrix \(csc\)"):
        dask_api.GPUFactorizationMachine(device="cpu", client=client).fit(dX, dy)


def test_misaligned_y(client, binary):
    X, y = binary
    dX, _, _ = _dask(X, y)
    dy = da.from_array(y, chunks=CHUNK + 10)
    with pytest.raises(ValueError, match=r"y is not chunked like X's rows.*rechunk"):
        dask_api.GPULogisticRegression(device="cpu", client=client).fit(dX, dy)
    dsw = da.ones(X.shape[0], chunks=100)
    with pytest.raises(ValueError, match="sample_weight is not chunked like X's rows"):
        dask_api.GPULogisticRegression(device="cpu", client=client).fit(
            dX, da.from_array(y, chunks=CHUNK), dsw)


def test_column_chunks_refused(client, binary):
    X, y = binary
    dX = da.from_array(X, chunks=(CHUNK, 20), asarray=False)
    with pytest.raises(ValueError, match="chunked by rows only"):
        dask_api.GPULogisticRegression(device="cpu", client=client).fit(
            dX, da.from_array(y, chunks=CHUNK))


def test_bad_parameters_use_the_local_rules(client, binary):
    X, y = binary
    dX, dy, _ = _dask(X, y)
    from sklearn.utils._param_validation import InvalidParameterError

    with pytest.raises(InvalidParameterError, match="'C' parameter"):
        dask_api.GPULogisticRegression(C=-1.0, client=client).fit(dX, dy)
    with pytest.raises(ValueError, match="Solver lbfgs supports only"):
        dask_api.GPULogisticRegression(l1_ratio=1.0, client=client).fit(dX, dy)
    with pytest.raises(ValueError, match="warm_start=True is not supported"):
        dask_api.GPUFactorizationMachine(warm_start=True, client=client).fit(dX, dy)
    with pytest.raises(ValueError, match="solver='mcmc' is not supported"):
        dask_api.GPUFactorizationMachineRegressor(solver="mcmc", client=client).fit(
            dX, dy.astype(float))
    with pytest.raises(ValueError, match="at least 2 classes"):
        dask_api.GPUFactorizationMachine(device="cpu", client=client).fit(
            dX, da.zeros(X.shape[0], chunks=CHUNK, dtype=int))


def test_nccl_needs_gpu_workers_and_comm_is_checked(client, binary):
    X, y = binary
    dX, dy, _ = _dask(X, y)
    with pytest.raises(ValueError, match="comm='nccl' needs every worker on a GPU"):
        dask_api.GPULogisticRegression(device="cpu", comm="nccl", client=client).fit(
            dX, dy)
    with pytest.raises(ValueError, match="comm must be 'dask', 'nccl'"):
        dask_api.GPULogisticRegression(device="cpu", comm="mpi", client=client).fit(
            dX, dy)


def test_parameters_mirror_the_single_process_estimators():
    for name in ("GPULogisticRegression", "GPUFactorizationMachine",
                 "GPUFactorizationMachineRegressor"):
        ours = set(getattr(dask_api, name)().get_params())
        theirs = set(getattr(local_api, name)().get_params())
        assert ours == theirs | {"client", "comm", "sync_every"}


# --------------------------------------------------------------------------
# NCCL between GPU workers (not run without two GPUs)
# --------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(cuda_device_count() < 2, reason="needs two CUDA GPUs")
def test_nccl_lbfgs_equals_dask_comm(binary):
    dask_cuda = pytest.importorskip("dask_cuda")
    X, y = binary
    with dask_cuda.LocalCUDACluster(n_workers=2) as cluster, \
            distributed.Client(cluster, set_as_default=False) as c:
        dX, dy, _ = _dask(X, y)
        kw = dict(tol=1e-9, max_iter=1000, device="cuda", client=c)
        a = dask_api.GPULogisticRegression(**kw, comm="nccl").fit(dX, dy)
        b = dask_api.GPULogisticRegression(**kw, comm="dask").fit(dX, dy)
        assert _rel(a.coef_, b.coef_) < 1e-6
        f = dask_api.GPUFactorizationMachine(n_factors=4, max_iter=2, random_state=0,
                                             concurrency=1, device="cuda", client=c,
                                             comm="nccl").fit(dX, dy)
        g = dask_api.GPUFactorizationMachine(n_factors=4, max_iter=2, random_state=0,
                                             concurrency=1, device="cuda", client=c,
                                             comm="dask").fit(dX, dy)
        np.testing.assert_allclose(f.factors_, g.factors_, rtol=1e-5, atol=1e-6)


def test_clone_shares_the_client_and_pickle_drops_it(client, binary):
    import pickle

    from sklearn.base import clone

    X, y = binary
    est = dask_api.GPULogisticRegression(C=0.3, device="cpu", client=client)
    twin = clone(est)
    assert twin.client is client and twin.C == 0.3
    dX, dy, _ = _dask(X, y)
    est.fit(dX, dy)
    back = pickle.loads(pickle.dumps(est))
    assert back.client is None
    np.testing.assert_array_equal(back.predict(X), est.to_local().predict(X))


@pytest.mark.gpu
@pytest.mark.skipif(cuda_device_count() < 1, reason="needs a CUDA GPU")
def test_one_gpu_worker_is_the_single_gpu_fit(binary):
    """One dask-cuda worker: L-BFGS (the fused GPU objective per partition)
    and a one-partition FM give the single-GPU fit's model."""
    dask_cuda = pytest.importorskip("dask_cuda")
    X, y = binary
    with dask_cuda.LocalCUDACluster(n_workers=1) as cluster, \
            distributed.Client(cluster, set_as_default=False) as c:
        dX, dy, _ = _dask(X, y)
        kw = dict(tol=1e-9, max_iter=1000, device="cuda")
        a = dask_api.GPULogisticRegression(**kw, client=c).fit(dX, dy)
        b = local_api.GPULogisticRegression(**kw).fit(X, y)
        assert a.device_.startswith("cuda")
        assert _rel(a.coef_, b.coef_) < 1e-4
        kw = dict(n_factors=4, max_iter=2, random_state=0, concurrency=1, tol=None,
                  device="cuda")
        f = dask_api.GPUFactorizationMachine(**kw, client=c).fit(*_dask(X, y, X.shape[0])[:2])
        g = local_api.GPUFactorizationMachine(**kw).fit(X, y)
        np.testing.assert_allclose(f.factors_, g.factors_, rtol=1e-4, atol=1e-6)


def test_regressor_does_not_depend_on_the_units_of_y(client, request):
    """As the single-process regressor, the Dask one standardises the target."""
    X, y = _problem("regression", request)
    local = local_api.GPUFactorizationMachineRegressor(
        n_factors=4, batch_size=64, max_iter=3, random_state=4, device="cpu", tol=None)
    fits = []
    for t in (y, y * 1000 + 5):
        dX, dy, _ = _dask(X, t, chunk=UNEQUAL)
        fits.append(_dask_of(local, client).fit(dX, dy).to_local().predict(X))
    p, q = fits
    np.testing.assert_allclose(q, p * 1000 + 5, rtol=0, atol=1e-4 * 1000 * np.abs(p).max())


def test_max_iter_reached_warns_as_the_single_process_fit(client, binary):
    from sklearn.exceptions import ConvergenceWarning

    X, y = binary
    dX, dy, _ = _dask(X, y)
    kw = dict(solver="adagrad", max_iter=2, tol=1e-12, random_state=0, device="cpu")
    with pytest.warns(ConvergenceWarning, match="Maximum number of iteration"):
        local_api.GPULogisticRegression(**kw).fit(X, y)
    with pytest.warns(ConvergenceWarning, match="Maximum number of iteration"):
        dask_api.GPULogisticRegression(client=client, **kw).fit(dX, dy)
