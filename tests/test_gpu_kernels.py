"""CUDA kernels against the float64 reference and the CPU backend (marker gpu).

Fresh random inputs every run; sizes that do not divide the tiles; empty rows
and columns; one feature present in every row; n_factors 1 to 128.

The training kernel runs through the estimators' entry point
(``_cuda.run_epoch``), the benchmarks' ablation (``_ablation.run_epoch_ablation``)
and the diagnostic one that forces a cluster size (``_ablation.run_epoch_diagnostic``;
``workers=1, cluster=1``: one plain thread block, strictly in order).
"""

import numpy as np
import pytest

from sklearn_cuwide._device import cuda_device_count

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(cuda_device_count() == 0, reason="needs a CUDA GPU"),
]

from sklearn_cuwide import _kernels  # noqa: E402
from sklearn_cuwide._backends import _cpu  # noqa: E402
from sklearn_cuwide._layout import build_layout  # noqa: E402
from sklearn_cuwide._solvers import batch_weights, fit_lbfgs_linear  # noqa: E402

from ._cases import CONFIGS, make_case, random_problem  # noqa: E402
from ._reference import reference_epoch  # noqa: E402


@pytest.fixture(scope="module")
def cuda():
    from sklearn_cuwide._backends import get_backend

    return get_backend("cuda:0")


def _diagnostic():
    from sklearn_cuwide._backends._cuda._ablation import run_epoch_diagnostic

    return run_epoch_diagnostic


def _run_gpu(cuda, layout, y, sw, state, params, order, put_kw=None, epoch=None, **kw):
    """One epoch of ``epoch`` (default: the diagnostic entry point with
    ``kw``) from ``state``; returns (loss, state in the user's order, layout)."""
    import cupy as cp

    ro = layout.row_order
    dl = cuda.put_layout(layout, **(put_kw or {}))
    st = cuda.put_state(state.permute_features(layout.feature_order))
    loss = (epoch or _diagnostic())(
        dl,
        cp.asarray(y[ro].astype(np.float32)),
        cp.asarray(sw[ro].astype(np.float32)),
        batch_weights(layout, sw[ro]),
        st,
        params,
        order,
        **kw,
    )
    return loss, cuda.get_state(st).permute_features(layout.feature_rank), dl


def _compare(loss, out, ref_loss, ref, rtol=2e-3, atol=2e-5):
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-4)
    for k, v in out.arrays().items():
        assert np.isfinite(v).all(), k
        np.testing.assert_allclose(v, ref[k], rtol=rtol, atol=atol, err_msg=k)


def _check_epoch(cuda, rng, layout, y, sw, state, params, put_kw=None, epoch=None, **kw):
    """One GPU epoch of one worker in a random mini-batch order against the
    float64 reference's epoch from the same state; returns the device layout.

    ``epoch``: the entry point (called with ``workers=1`` and ``kw``);
    default: the diagnostic one with one plain thread block (``cluster=1``)
    unless ``kw`` names a cluster."""
    order = rng.permutation(layout.n_batches)
    ref = {k: v.astype(np.float64).copy() for k, v in state.arrays().items()}
    ref_loss = reference_epoch(layout, y, sw, ref, params, order)
    if epoch is None:
        kw.setdefault("cluster", 1)
    loss, out, dl = _run_gpu(cuda, layout, y, sw, state, params, order, put_kw=put_kw,
                             epoch=epoch, workers=1, **kw)
    _compare(loss, out, ref_loss, ref)
    return dl


@pytest.mark.parametrize("entry", ["one_block", "run_epoch"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_epoch_matches_reference(cuda, cfg, entry):
    """One plain thread block, and the estimators' entry point with one
    worker (a cluster of ``cluster_for(1)`` blocks, still in order)."""
    rng = np.random.default_rng()
    X, y, sw, layout, state, params = make_case(rng, cfg)
    epoch = cuda.run_epoch if entry == "run_epoch" else None
    _check_epoch(cuda, rng, layout, y, sw, state, params, epoch=epoch)


SCALED_ADAGRAD = [c for c in CONFIGS if c[1].get("penalty_scaled") and c[1]["solver"] == "adagrad"]


@pytest.mark.parametrize("cfg", SCALED_ADAGRAD, ids=[c[0] for c in SCALED_ADAGRAD])
def test_packed_penalty_factors_follow_the_layout(cuda, cfg):
    """Adagrad's sums and the penalty factors share one device buffer
    (``_train.pack_penalty``).  One device state trained for an epoch on each
    of two layouts of the same rows (other shuffles: the same feature order,
    other factors) and then a third epoch on the first matches the float64
    reference's three epochs: the factors are rewritten when the layout
    changes, and the packed sums persist between epochs.  The buffer's
    bookkeeping is the device state's (``state.packed``), not a global's."""
    import cupy as cp

    from sklearn_cuwide._backends._cuda import _train

    rng = np.random.default_rng()
    X, y, sw, l1, state, params = make_case(rng, cfg)
    l2 = build_layout(X, batch_size=96, sample_block=40, n_hot_max=12, shuffle=True,
                      random_state=int(rng.integers(1 << 30)))
    assert np.array_equal(l1.feature_order, l2.feature_order)
    from sklearn_cuwide._layout import penalty_scale

    assert not np.allclose(penalty_scale(l1), penalty_scale(l2))
    ref = {k: v.astype(np.float64).copy() for k, v in state.arrays().items()}
    st = cuda.put_state(state.permute_features(l1.feature_order))
    dls = {1: cuda.put_layout(l1), 2: cuda.put_layout(l2)}
    for which, lay in ((1, l1), (2, l2), (1, l1)):
        order = rng.permutation(lay.n_batches)
        ref_loss = reference_epoch(lay, y, sw, ref, params, order)
        ro = lay.row_order
        loss = _diagnostic()(dls[which], cp.asarray(y[ro].astype(np.float32)),
                             cp.asarray(sw[ro].astype(np.float32)),
                             batch_weights(lay, sw[ro]), st, params, order,
                             workers=1, cluster=1)
        np.testing.assert_allclose(loss, ref_loss, rtol=1e-4)
        rec = st.packed
        assert rec["token"] == dls[which]._pscale_token
        assert st.gw.base is rec["buffer"]
    assert not st.gw.flags.c_contiguous  # the packed view
    assert not hasattr(_train, "_PACKED_FOR")
    out = cuda.get_state(st).permute_features(l1.feature_rank)
    _compare(loss, out, ref_loss, ref)


@pytest.mark.parametrize("cluster", [2, 4, 8])
@pytest.mark.parametrize("cfg", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_cluster_epoch_matches_reference(cuda, cfg, cluster):
    """One worker of ``cluster`` blocks (a thread block cluster sharing each
    sample block) keeps the sequential order's result."""
    rng = np.random.default_rng()
    X, y, sw, layout, state, params = make_case(rng, cfg)
    _check_epoch(cuda, rng, layout, y, sw, state, params, cluster=cluster)


@pytest.mark.parametrize("cfg", [CONFIGS[2], CONFIGS[4]], ids=lambda c: c[0])
@pytest.mark.parametrize("case", ["tiny_blocks", "global_accumulators", "no_hot", "all_hot"])
def test_cluster_edge_cases_match_reference(cuda, cfg, case):
    """Clusters of 8 on sample blocks of fewer rows than blocks, with the
    per-sample accumulators in global memory, without hot features, and on
    sample blocks whose cold tile is empty."""
    import scipy.sparse as sp2

    rng = np.random.default_rng()
    kw, case_kw = {}, {}
    if case == "tiny_blocks":
        case_kw = dict(batch_size=16, sample_block=5)
    elif case == "global_accumulators":
        kw = dict(variant="global_accumulators")
    elif case == "no_hot":
        case_kw = dict(n_hot_max=0)
    if case == "all_hot":
        from sklearn_cuwide._state import ModelState, StepParams

        n = 700
        X = sp2.csr_matrix(rng.uniform(0.5, 1.5, size=(n, 6)).astype(np.float32))
        y = rng.integers(0, cfg[2] if cfg[2] > 1 else 2, n).astype(np.float64)
        sw = rng.uniform(0.5, 2.0, n)
        params = StepParams(learning_rate=0.1, l2_w=1e-3, l2_v=1e-3, **cfg[1])
        layout = build_layout(X, batch_size=64, sample_block=30, n_hot_max=6, shuffle=True,
                              random_state=1)
        assert (layout.tile_ptr[2::2] == layout.tile_ptr[1::2]).all()
        state = ModelState.zeros(6, cfg[2], cfg[3], adagrad=True, init_scale=0.1,
                                 random_state=2)
    else:
        X, y, sw, layout, state, params = make_case(rng, cfg, **case_kw)
    if case == "no_hot":
        assert layout.n_hot == 0
    _check_epoch(cuda, rng, layout, y, sw, state, params, cluster=8, **kw)


def test_entry_points_reject_bad_options(cuda):
    from sklearn_cuwide._backends._cuda._ablation import run_epoch_ablation

    rng = np.random.default_rng(0)
    X, y, sw, layout, state, params = make_case(rng, CONFIGS[0])
    order = np.arange(layout.n_batches)
    with pytest.raises(ValueError, match="cluster must be one of"):
        _run_gpu(cuda, layout, y, sw, state, params, order, cluster=3)
    with pytest.raises(ValueError, match="workers must be"):
        _run_gpu(cuda, layout, y, sw, state, params, order, epoch=cuda.run_epoch, workers=0)
    with pytest.raises(ValueError, match="variant must be one of"):
        _run_gpu(cuda, layout, y, sw, state, params, order, epoch=run_epoch_ablation,
                 variant="plain")
    import cupy as cp

    dl = cuda.put_layout(layout)
    st = cuda.put_state(state.permute_features(layout.feature_order))
    ro = layout.row_order
    with pytest.raises(TypeError, match="float32"):  # y as float64
        cuda.run_epoch(dl, cp.asarray(y[ro]), cp.asarray(sw[ro].astype(np.float32)),
                       batch_weights(layout, sw[ro]), st, params, order)


@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[2], CONFIGS[5]], ids=lambda c: c[0])
@pytest.mark.parametrize(
    "switch",
    ["stream", "no_hot", "no_hot_long", "no_replicas", "global_accumulators", "device_tiles"],
)
def test_switches_match_reference(cuda, cfg, switch):
    """Streaming through two buffers and each ablation variant (one plain
    thread block) compute the same.

    ``no_hot_long``: 300-row sample blocks and no hot features, so the
    feature in every row is a cold segment of 300 nonzeros, longer than the
    LR cold apply's window of 96 (it is summed across windows)."""
    rng = np.random.default_rng()
    kw, put_kw, case_kw = {}, None, {}
    if switch == "stream":
        put_kw = dict(memory_budget=0, chunk_bytes=4096)
    elif switch == "no_hot":
        case_kw = dict(n_hot_max=0)
    elif switch == "no_hot_long":
        case_kw = dict(n_hot_max=0, batch_size=600, sample_block=300)
    elif switch in ("no_replicas", "global_accumulators"):
        kw = dict(variant=switch)
    elif switch == "device_tiles":
        sb, nh = cuda.tile_shape(make_case(rng, cfg)[5], cfg[2], cfg[3], 256)
        case_kw = dict(batch_size=256, sample_block=sb, n_hot_max=nh)
    X, y, sw, layout, state, params = make_case(rng, cfg, **case_kw)
    if switch.startswith("no_hot"):
        assert layout.n_hot == 0
    dl = _check_epoch(cuda, rng, layout, y, sw, state, params, put_kw=put_kw, **kw)
    if switch == "stream":
        assert not dl.resident and len(dl.chunks) > 3


FM_CONFIGS = [c for c in CONFIGS if c[1]["model"] == "fm"]
# too wide for the in-order kernel's shared slots of the hot tile (its
# partial sums go straight to global memory)
WIDE_FM = ("fm300-adagrad", dict(model="fm", loss="logistic", solver="adagrad"), 1, 300)


@pytest.mark.parametrize("case", ["in_order_tiles", "small_tiles", "no_hot", "all_hot_rule",
                                  "stream", "one_row_blocks"])
@pytest.mark.parametrize("cfg", FM_CONFIGS + [WIDE_FM], ids=[c[0] for c in FM_CONFIGS + [WIDE_FM]])
def test_in_order_kernel_matches_reference(cuda, cfg, case, monkeypatch):
    """An FM's one worker is ``cuwide_train_in_order`` (every block of the
    grid in every step, grid barriers between the stages): one epoch equals
    the float64 reference's, on the tiles the in-order fits use (a sample
    block per mini-batch, the hot features as the layout rule admits them,
    a hot feature's run spread over many groups), on the concurrent
    kernels' smaller tiles, without hot features, with a streamed layout (a
    launch per chunk, the scratch zeroed for each) and on sample blocks of
    one row; for every FM config and one too wide for the shared slots."""
    from sklearn_cuwide._backends._cuda import _train

    rng = np.random.default_rng()
    put_kw, case_kw = None, {}
    if case == "in_order_tiles":
        sb, nh = cuda.tile_shape(make_case(rng, cfg)[5], 1, cfg[3], 96, 1)
        assert sb == 96  # a sample block per mini-batch
        case_kw = dict(batch_size=96, sample_block=sb, n_hot_max=nh)
    elif case == "no_hot":
        case_kw = dict(n_hot_max=0)
    elif case == "all_hot_rule":
        case_kw = dict(batch_size=200, sample_block=200, n_hot_max=10_000)
    elif case == "stream":
        put_kw = dict(memory_budget=0, chunk_bytes=4096)
    elif case == "one_row_blocks":
        case_kw = dict(batch_size=4, sample_block=1)
    X, y, sw, layout, state, params = make_case(rng, cfg, **case_kw)
    made = []  # the in-order kernel's scratch: that kernel ran

    class Scratch(_train.InOrderScratch):
        def __init__(self, *a):
            made.append(a)
            super().__init__(*a)

    monkeypatch.setattr(_train, "InOrderScratch", Scratch)
    if case == "no_hot":
        assert layout.n_hot == 0
    dl = _check_epoch(cuda, rng, layout, y, sw, state, params, put_kw=put_kw,
                      epoch=cuda.run_epoch)
    assert made == [(layout.sample_block, layout.n_hot, cfg[3])]
    if case == "stream":
        assert not dl.resident and len(dl.chunks) > 3


@pytest.mark.parametrize("variant", ["no_replicas", "global_accumulators"])
@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[2], CONFIGS[5]], ids=lambda c: c[0])
def test_ablation_entry_point_matches_reference(cuda, cfg, variant):
    """The benchmarks' ablation entry point with one worker (a cluster of
    ``cluster_for(1)`` blocks, in order) computes what the reference does."""
    from sklearn_cuwide._backends._cuda._ablation import run_epoch_ablation

    rng = np.random.default_rng()
    X, y, sw, layout, state, params = make_case(rng, cfg)
    _check_epoch(cuda, rng, layout, y, sw, state, params, epoch=run_epoch_ablation,
                 variant=variant)


def test_resident_second_epoch_and_hogwild(cuda):
    """After the streamed first epoch the layout is resident; the concurrent
    (Hogwild) mode trains to about the same loss as the sequential one."""
    rng = np.random.default_rng()
    cfg = CONFIGS[4]
    X, y, sw, layout, state, params = make_case(rng, cfg, n=20011, d=2003, density=0.005)
    order = rng.permutation(layout.n_batches)
    losses = {}
    for det in (True, False, "cluster"):
        import cupy as cp

        ro = layout.row_order
        dl = cuda.put_layout(layout, chunk_bytes=8192)
        st = cuda.put_state(state.permute_features(layout.feature_order))
        args = (cp.asarray(y[ro].astype(np.float32)), cp.asarray(sw[ro].astype(np.float32)),
                batch_weights(layout, sw[ro]))
        ls = []
        # True: one plain block in order; False: the estimators' default grid;
        # "cluster": concurrent workers of 4-block clusters
        epoch, kw = cuda.run_epoch, {}
        if det is True:
            epoch, kw = _diagnostic(), dict(workers=1, cluster=1)
        elif det == "cluster":
            epoch, kw = _diagnostic(), dict(workers=4, cluster=4)
        for _ in range(3):
            ls.append(epoch(dl, *args, st, params, order, **kw))
        assert dl.resident and dl.uploaded
        losses[det] = ls
    for mode in (False, "cluster"):
        assert np.isfinite(losses[mode]).all()
        assert losses[mode][-1] < losses[mode][0]
        np.testing.assert_allclose(losses[mode][-1], losses[True][-1], rtol=0.05)


@pytest.mark.parametrize("policy", [("cap", 4.0), ("cap", 1e9), ("power", 0.5)])
def test_concurrency_scale_matches_float64_and_its_prefix(cuda, policy):
    """The per-feature step scales under concurrency against a float64
    computation; every feature past ``n_scaled`` (which the kernel reads no
    scale for) has a scale of exactly 1."""
    rng = np.random.default_rng()
    X, y, sw, layout, state, params = make_case(rng, CONFIGS[0], n=3001, d=997, density=0.01)
    dl = cuda.put_layout(layout)
    P = 37
    kind, v = policy
    if kind == "cap":
        s, n_scaled, sb = dl.concurrency_scale(P, cap=v)
    else:
        s, n_scaled, sb = dl.concurrency_scale(P, power=v)
    s = cuda.to_host(s).astype(np.float64)
    counts = layout.feature_counts[layout.feature_order].astype(np.float64)
    q = np.clip(-np.expm1(-counts * layout.batch_size / layout.n_rows), 0.0, 1.0)
    upd = 1.0 + (P - 1) * q
    want = np.minimum(1.0, v / upd) if kind == "cap" else upd ** -v
    np.testing.assert_allclose(s, want, rtol=1e-6)
    assert sb == pytest.approx(min(1.0, v / P) if kind == "cap" else P ** -v)
    damped = np.flatnonzero(want < 1.0)
    assert n_scaled == (damped[-1] + 1 if damped.size else 0)
    assert (s[n_scaled:] == 1.0).all()
    if kind == "cap" and v < P:
        assert 0 < n_scaled < layout.n_features  # the frequent features only
    if v > P:
        assert n_scaled == 0


@pytest.mark.parametrize("idx", [np.int32, np.int64])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("model", ["lr1", "lr3", "fm1", "fm8", "fm16", "fm64", "fm128"])
def test_predict_kernel(cuda, idx, dtype, model):
    import cupy as cp
    import cupyx.scipy.sparse as cpsp

    rng = np.random.default_rng()
    X, _, _ = random_problem(rng, n=1501, d=257)
    X = X.astype(dtype)
    d = X.shape[1]
    D = 3 if model == "lr3" else 1
    k = int(model[2:]) if model.startswith("fm") else 0
    w = rng.normal(size=(d, D)).astype(np.float32)
    b = rng.normal(size=D).astype(np.float32)
    V = rng.normal(scale=0.3, size=(d, k)).astype(np.float32) if k else None
    ref = _cpu.decision_function(X, w, b, V)
    Xh = X.copy()
    Xh.indices = Xh.indices.astype(idx)  # scipy keeps what it is given
    Xh.indptr = Xh.indptr.astype(idx)
    out = cp.full((X.shape[0], D), cp.nan, dtype=cp.float32)  # poisoned
    got = cp.asnumpy(cuda.decision_function(Xh, w, b, V, out=out))
    assert np.isfinite(cp.asnumpy(out)).all()  # every element written
    if idx is np.int32:  # cupyx input, no host round trip
        got2 = cp.asnumpy(cuda.decision_function(cpsp.csr_matrix(X), w, b, V))
        np.testing.assert_allclose(got2, got, rtol=1e-6, atol=1e-6)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4 * max(1.0, np.abs(ref).max()))


@pytest.mark.parametrize("loss,D", [("logistic", 1), ("multinomial", 4)])
def test_lbfgs_gpu_matches_cpu(cuda, loss, D):
    rng = np.random.default_rng()
    X, y, sw = random_problem(rng, n=3001, d=401, n_outputs=D, loss=loss)
    kw = dict(loss=loss, n_outputs=D, C=0.5, fit_intercept=True, max_iter=500, tol=1e-9)
    c_cpu, i_cpu, _, _ = fit_lbfgs_linear(X, y, sw, backend=_cpu, **kw)
    c_gpu, i_gpu, _, _ = fit_lbfgs_linear(X, y, sw, backend=cuda, **kw)
    scale = np.abs(c_cpu).max()
    np.testing.assert_allclose(c_gpu, c_cpu, rtol=1e-4, atol=1e-4 * scale)
    np.testing.assert_allclose(i_gpu, i_cpu, rtol=1e-4, atol=1e-4 * scale)


@pytest.mark.parametrize("lanes", _kernels.LBFGS_ROW_LANES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_fused_logistic_objective_matches_float64(cuda, dtype, fit_intercept, lanes,
                                                  monkeypatch):
    """The two fused L-BFGS kernels against a float64 numpy objective, at a
    random point, with empty rows/columns, a feature present in every row
    and rows longer than a warp, for every number of lanes per row of the
    forward pass."""
    import cupy as cp
    import scipy.sparse as sp

    from sklearn_cuwide._backends._cuda import _lbfgs

    monkeypatch.setattr(_lbfgs, "lbfgs_row_lanes", lambda nnz, n_rows: lanes)
    rng = np.random.default_rng()
    n, d = int(rng.integers(2000, 5000)), int(rng.integers(300, 900))
    X = sp.random(n, d, density=0.02, format="csr", random_state=rng, dtype=np.float64)
    X = X.tolil()
    X[:, 7] = rng.uniform(0.5, 2.0, size=(n, 1))  # present in every row
    X[:, 11] = 0.0  # empty column
    X[5, :] = 0.0  # empty row
    X[9, :] = rng.uniform(-1.0, 1.0, size=(1, d))  # every feature: a long row
    X[9, 11] = 0.0
    X = X.tocsr().astype(dtype)
    X.eliminate_zeros()
    y = (rng.random(n) < 0.4).astype(np.float64)
    ws = rng.uniform(0.1, 2.0, n)
    ws /= ws.sum()
    lam = 1e-3
    x = rng.normal(scale=0.5, size=d + int(fit_intercept))
    fg = cuda.fused_objective(X, cp.asarray(y), cp.asarray(ws), loss="logistic",
                              n_outputs=1, lam=lam, fit_intercept=fit_intercept)
    for trial in range(2):  # a second call must not see the first one's sums
        f, g = fg(cp.asarray(x))
        X64 = X.astype(np.float64)
        z = X64 @ x[:d] + (x[d] if fit_intercept else 0.0)
        lo = np.logaddexp(0.0, z) - y * z
        e = ws * (1.0 / (1.0 + np.exp(-z)) - y)
        f_ref = ws @ lo + 0.5 * lam * x[:d] @ x[:d]
        g_ref = np.concatenate([X64.T @ e + lam * x[:d], [e.sum()] if fit_intercept else []])
        np.testing.assert_allclose(float(f), f_ref, rtol=1e-12)
        np.testing.assert_allclose(cp.asnumpy(g), g_ref, rtol=1e-10, atol=1e-14)
        x = x * 1.5


def test_lbfgs_memory_kernels_match_numpy(cuda):
    """The L-BFGS memory products (one kernel each) against numpy float64."""
    import cupy as cp

    from sklearn_cuwide._lbfgs import ArrayMemoryOps

    rng = np.random.default_rng()
    n = int(rng.integers(1000, 300000))
    B = rng.normal(size=(20, n))
    B[7] = 0.0  # a free slot
    s, y, g = rng.normal(size=(3, n))
    ref = ArrayMemoryOps(np)
    ops = cuda.lbfgs_memory_ops()
    Bd = cp.asarray(B)
    got = ops.gram(Bd, Bd[4], Bd[5], cp.asarray(g))
    np.testing.assert_allclose(got, ref.gram(B, B[4], B[5], g), rtol=1e-11, atol=1e-9)
    c, cg = rng.normal(size=20), float(rng.normal())
    d = ops.direction(Bd, c, cg, cp.asarray(g))
    np.testing.assert_allclose(cp.asnumpy(d), ref.direction(B, c, cg, g), rtol=1e-11,
                               atol=1e-11)


def test_fused_objective_declines_other_losses(cuda):
    assert cuda.fused_objective(None, None, None, loss="multinomial", n_outputs=3,
                                lam=0.0, fit_intercept=True) is None


def test_layout_from_device_tiles_full_fit(cuda):
    """A multi-epoch fit through fit_minibatch on the GPU, one worker (the
    estimators' ``concurrency=1``), lands near the CPU's."""
    from sklearn_cuwide._solvers import fit_minibatch
    from sklearn_cuwide._state import ModelState, StepParams

    rng = np.random.default_rng()
    X, y, sw = random_problem(rng, n=30000, d=1001, density=0.01)
    params = StepParams(model="fm", loss="logistic", solver="adagrad", learning_rate=0.05)
    res = {}
    for name, be in (("cpu", _cpu), ("gpu", cuda)):
        sb, nh = be.tile_shape(params, 1, 8, 512)
        L = build_layout(X, batch_size=512, sample_block=sb, n_hot_max=nh, shuffle=True, random_state=0)
        st = ModelState.zeros(X.shape[1], 1, 8, adagrad=True, init_scale=0.01, random_state=0)
        st, n_iter, curve, *_ = fit_minibatch(
            L, y, sw, st, params, backend=be, max_iter=3, shuffle=True, random_state=0,
            workers=1,
        )
        res[name] = (st, curve)
    np.testing.assert_allclose(res["gpu"][1], res["cpu"][1], rtol=1e-3)
    np.testing.assert_allclose(res["gpu"][0].w, res["cpu"][0].w, rtol=1e-2, atol=1e-4)


@pytest.mark.parametrize("shuffle", [False, True])
def test_layout_built_on_gpu_is_identical(cuda, shuffle):
    import cupy as cp
    import cupyx.scipy.sparse as cpsp

    rng = np.random.default_rng()
    X, _, _ = random_problem(rng, n=3001, d=401)
    kw = dict(batch_size=128, sample_block=50, n_hot_max=9, shuffle=shuffle, random_state=4)
    A = build_layout(X, **kw)
    for src in (X, cpsp.csr_matrix(X)):
        B = build_layout(src, xp=cp, chunk_nnz=2000, **kw)
        assert isinstance(B.feat, cp.ndarray)
        for name in ("feat", "row", "val", "feature_order", "feature_rank", "feature_counts"):
            np.testing.assert_array_equal(cp.asnumpy(getattr(B, name)), getattr(A, name), err_msg=name)
        for name in ("tile_ptr", "sblock_row_ptr", "batch_sblock_ptr", "row_order"):
            np.testing.assert_array_equal(getattr(B, name), getattr(A, name), err_msg=name)


def test_all_hot_sample_blocks(cuda):
    """Sample blocks whose cold tile is empty (every feature hot)."""
    import scipy.sparse as sp2

    rng = np.random.default_rng()
    cfg = CONFIGS[4]
    X = sp2.csr_matrix(rng.uniform(0.5, 1.5, size=(500, 6)).astype(np.float32))
    y = (rng.random(500) < 0.4).astype(np.float64)
    sw = rng.uniform(0.5, 2.0, 500)
    from sklearn_cuwide._state import ModelState, StepParams

    params = StepParams(learning_rate=0.1, l2_w=1e-3, l2_v=1e-3, **cfg[1])
    layout = build_layout(X, batch_size=64, sample_block=30, n_hot_max=6, shuffle=True, random_state=1)
    assert layout.n_hot == 6 and (layout.tile_ptr[2::2] == layout.tile_ptr[1::2]).all()
    state = ModelState.zeros(6, 1, cfg[3], adagrad=True, init_scale=0.1, random_state=2)
    _check_epoch(cuda, rng, layout, y, sw, state, params)


@pytest.mark.parametrize("model", ["lr", "fm"])
def test_classic_kernel_matches_per_sample_reference(cuda, model):
    """The ablation baseline: one warp = plain per-sample sgd, in order."""
    import cupy as cp
    import cupyx.scipy.sparse as cpsp

    from sklearn_cuwide._state import ModelState, StepParams

    rng = np.random.default_rng()
    X, y, sw = random_problem(rng, n=200, d=50, density=0.1)
    k = 4 if model == "fm" else 0
    params = StepParams(model="fm" if k else "linear", loss="logistic", solver="sgd",
                        learning_rate=0.05, l2_w=1e-3, l2_v=1e-3)
    st = ModelState.zeros(50, 1, k, init_scale=0.1, random_state=0)
    order = rng.permutation(200)
    # float64 per-sample reference
    w, b = st.w[:, 0].astype(np.float64), float(st.b[0])
    V = st.V.astype(np.float64) if k else None
    Xd = X.toarray().astype(np.float64)
    for r in order:
        x = Xd[r]
        nz = np.flatnonzero(x)
        z = b + x @ w
        if k:
            s = x @ V
            z += 0.5 * (s @ s - ((x[:, None] * V) ** 2).sum())
        d = sw[r] * (1 / (1 + np.exp(-z)) - y[r])
        gw = d * x[nz] + 1e-3 * w[nz]
        if k:
            gV = d * x[nz, None] * (s[None, :] - V[nz] * x[nz, None]) + 1e-3 * V[nz]
            V[nz] -= 0.05 * gV
        w[nz] -= 0.05 * gw
        b -= 0.05 * d
    dst = cuda.put_state(st)
    from sklearn_cuwide._backends._cuda._ablation import run_epoch_classic

    run_epoch_classic(cpsp.csr_matrix(X), cp.asarray(y.astype(np.float32)),
                      cp.asarray(sw.astype(np.float32)), dst, params, order,
                      deterministic=True)
    out = cuda.get_state(dst)
    np.testing.assert_allclose(out.w[:, 0], w, rtol=1e-3, atol=1e-5)
    np.testing.assert_allclose(out.b[0], b, rtol=1e-3, atol=1e-5)
    if k:
        np.testing.assert_allclose(out.V, V, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "pageable"])
@pytest.mark.parametrize("dtype,width,wider", [(np.float32, 33, 0), (np.float32, 1, 0),
                                               (np.float64, 5, 0), (np.float32, 1, 1),
                                               (np.float32, 3, 2)])
def test_row_kernels_match_numpy(cuda, pinned, dtype, width, wider):
    """Cold rows gathered from host memory into device slots and scattered
    back (``cuda/cuwide_rows.cu`` for page-locked rows; pieces of ordinary
    copies otherwise) equal numpy's fancy indexing; the rows not named stay
    as they were, bit for bit.  ``wider``: the device rows are the leading
    columns of a buffer that many columns wider (as Adagrad's sums packed
    beside the penalty factors are), whose other columns stay untouched."""
    import cupy as cp

    from sklearn_cuwide._backends._cuda import _rows
    from sklearn_cuwide._backends._cuda._upload import is_pinned

    rng = np.random.default_rng()
    n_rows = 3 * _rows.PIECE_ROWS + 17 if not pinned else 20011
    ref = rng.standard_normal((n_rows, width)).astype(dtype)
    host = cuda.host_rows(ref) if pinned else ref.copy()
    assert is_pinned(cp, host) == pinned
    ids = np.sort(rng.choice(n_rows, size=n_rows // 3, replace=False)).astype(np.int64)
    ids_d = cp.asarray(ids)
    # 5 slots not written, and ``wider`` columns beside the rows
    buf = cp.full((ids.size + 5, width + wider), np.nan, dtype=dtype)
    out = buf[:, :width]
    cuda.gather_rows(host, ids_d, out[: ids.size])
    cuda.synchronize()
    got = cp.asnumpy(buf)
    np.testing.assert_array_equal(got[: ids.size, :width], ref[ids])
    assert np.isnan(got[ids.size :]).all() and np.isnan(got[:, width:]).all()
    new = rng.standard_normal((ids.size, width)).astype(dtype)
    out[: ids.size] = cp.asarray(new)
    cuda.scatter_rows(out[: ids.size], ids_d, host)
    cuda.synchronize()
    want = ref.copy()
    want[ids] = new
    np.testing.assert_array_equal(host, want)
    # nothing to move is a no-op
    cuda.gather_rows(host, ids_d[:0], out[:0])
    cuda.scatter_rows(out[:0], ids_d[:0], host)
    cuda.synchronize()
    np.testing.assert_array_equal(host, want)


@pytest.mark.parametrize("int64", [False, True])
def test_build_kernels_give_the_numpy_build(int64):
    """The layout build's fused kernels (``cuda/cuwide_build.cu``) through
    each way a build reaches them: the CSR uploaded whole (some rows of it,
    shuffled), a cupyx matrix, chunks gathered on the host (into device and
    into page-locked arrays); then the penalty factors and the copy of some
    rows (early stopping's held-out rows).  The numpy build's
    layout and factors, bit for bit (the sanitizers run this test)."""
    import cupy as cp
    import cupyx.scipy.sparse as cpsp

    from sklearn_cuwide._backends._cuda import _upload
    from sklearn_cuwide._backends._cuda._build import CudaBuildKernels, rows_of_arrays
    from sklearn_cuwide._backends._cuda._layout import put_layout
    from sklearn_cuwide._layout import penalty_scale

    from .test_device_pipeline import _kw, _problem
    from .test_gpu_upload import _assert_same

    rng = np.random.default_rng()
    X = _problem(rng, n=3001, int64=int64)
    rows = np.flatnonzero(rng.random(X.shape[0]) < 0.9)
    kw = _kw(True, 64, 30)
    A = build_layout(X[rows], **kw)
    B = _upload.build_on_device(X, cp, chunk_nnz=2003, upload_chunk_nnz=4099, rows=rows,
                                kernels=CudaBuildKernels(), **kw)
    _assert_same(A, B, "uploaded, some rows")
    A = build_layout(X, **kw)
    if not int64:
        _assert_same(A, build_layout(cpsp.csr_matrix(X), xp=cp, chunk_nnz=2003,
                                     kernels=CudaBuildKernels(), **kw), "cupyx")
    for host_out in (False, True):
        _assert_same(A, _upload.build_from_host(X, cp, chunk_nnz=2003, host_out=host_out,
                                                kernels=CudaBuildKernels(), **kw),
                     f"from the host, host_out={host_out}")
    C = _upload.build_on_device(X, cp, chunk_nnz=2003, kernels=CudaBuildKernels(), **kw)
    _assert_same(A, C, "uploaded")
    np.testing.assert_array_equal(penalty_scale(A), put_layout(C).penalty_scale().get())
    # the held-out rows' copy: scipy's rows, from the whole upload (int64
    # indptr) and from a cupyx matrix (that of its indices), none at all too
    held = np.flatnonzero(rng.random(X.shape[0]) < 0.1)
    for what, arrays in (("uploaded", _upload.upload_csr(X, cp)),
                         ("cupyx", None if int64 else cpsp.csr_matrix(X))):
        if arrays is None:
            continue
        arrays = arrays if what == "uploaded" else (arrays.indptr, arrays.indices, arrays.data)
        for r in (held, held[:0]):
            got = rows_of_arrays(*arrays, X.shape, r)
            want = X[r]
            assert got.shape == want.shape and got.has_canonical_format, what
            np.testing.assert_array_equal(got.indptr.get(), want.indptr, err_msg=what)
            np.testing.assert_array_equal(got.indices.get(), want.indices, err_msg=what)
            np.testing.assert_array_equal(got.data.get(), want.data, err_msg=what)


def test_row_order_kernel_gives_the_host_permutation():
    """The layout's row order drawn on the device
    (``cuwide_keyed_permutation``) equals the host's draw for the same seed,
    value for value: sizes at, below and above powers of two (the cycle
    walk of a value past ``n``), and a fit's size."""
    import cupy as cp

    from sklearn_cuwide._backends._cuda._build import CudaBuildKernels
    from sklearn_cuwide._layout import row_permutation

    kernels = CudaBuildKernels()
    for n in (2, 3, 4, 5, 1023, 1024, 1025, 65537, 3_600_001):
        for seed in (0, 12345):
            got = kernels.row_order(n, seed)
            assert got.dtype == cp.int64 and got.shape == (n,)
            np.testing.assert_array_equal(got.get(), row_permutation(n, True, seed),
                                          err_msg=f"n={n}, seed={seed}")


@pytest.mark.parametrize("loss", ["logistic", "squared", "multinomial"])
def test_weighted_loss_kernel_matches_numpy(loss):
    """Early stopping's validation loss on the device (``cuda/cuwide_loss.cu``;
    the multinomial loss through the array operations) against the CPU
    backend's: numpy's pointwise loss in float64, weighted; large decision
    values (no overflow), zero weights, sizes that are no multiple of a
    warp."""
    import cupy as cp

    from sklearn_cuwide._backends import _cuda

    rng = np.random.default_rng()
    for n in (1, 31, 1000, 100003):
        D = 3 if loss == "multinomial" else 1
        Z = rng.normal(scale=4.0, size=(n, D))
        Z[:: 7] *= 200.0
        y = (rng.integers(0, D, n) if loss == "multinomial" else
             rng.integers(0, 2, n) if loss == "logistic" else rng.normal(size=n)).astype(
                 np.float64)
        w = rng.random(n)
        w[:: 5] = 0.0
        w[0] = 1.0
        want = _cpu.weighted_loss(Z, y, w, loss)
        got = _cuda.weighted_loss(cp.asarray(Z), cp.asarray(y), cp.asarray(w), loss)
        assert isinstance(got, float)
        np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=f"{loss} n={n}")
        # the same bits every run: early stopping compares these
        assert _cuda.weighted_loss(cp.asarray(Z), cp.asarray(y), cp.asarray(w), loss) == got


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_factors_kernel_draws_numpys_bits(dtype):
    """The initial factors on the device (``cuda/cuwide_factors.cu``): the
    numpy draw's bits, for features in any order, a seed near 2**64 and a
    factor count that is no power of two."""
    import cupy as cp

    from sklearn_cuwide._backends import _cuda
    from sklearn_cuwide._state import draw_factors

    view = np.uint32 if dtype == np.float32 else np.uint64
    order = np.random.default_rng().permutation(70001).astype(np.int64)
    for seed, k in ((2**64 - 5, 7), (3, 16)):
        want = draw_factors(np, seed, 0.3, order, k, dtype=dtype)
        got = _cuda.draw_factors(seed, 0.3, cp.asarray(order), k, dtype)
        assert got.dtype == dtype and got.shape == want.shape
        np.testing.assert_array_equal(want.view(view), got.get().view(view))
