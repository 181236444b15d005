"""The MCMC solver of the FM regressor (``sklearn_cuwide._mcmc``): its
blocks, its sweeps against a slow feature-at-a-time numpy reference with
the same draws, and the estimator with ``solver="mcmc"``."""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.linear_model import BayesianRidge
from sklearn.utils._param_validation import InvalidParameterError

from sklearn_cuwide import GPUFactorizationMachine, GPUFactorizationMachineRegressor
from sklearn_cuwide import _memory
from sklearn_cuwide._device import cuda_device_count
from sklearn_cuwide._mcmc import MCMCPriors, feature_blocks, fit_mcmc

HAS_GPU = cuda_device_count() > 0


def _random_csr(n, d, density, seed):
    rng = np.random.default_rng(seed)
    X = sp.random(n, d, density=density, format="csr", random_state=rng)
    X.data = rng.uniform(-2.0, 2.0, X.nnz)
    X.sort_indices()
    return X


def _one_hot_fields(n, sizes, seed):
    """Rows of one id per field, each field a range of columns in order."""
    rng = np.random.default_rng(seed)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    cols = np.column_stack([s + rng.integers(0, m, n) for s, m in zip(starts, sizes)])
    k = len(sizes)
    return sp.csr_matrix((np.ones(n * k), cols.ravel(), np.arange(0, n * k + 1, k)),
                         shape=(n, int(sum(sizes)))), starts


# --------------------------------------------------------------------------
# blocks
# --------------------------------------------------------------------------
@pytest.mark.parametrize("n, d, density, seed", [(50, 30, 0.1, 0), (200, 40, 0.3, 1),
                                                 (30, 100, 0.02, 2), (80, 5, 0.9, 3)])
def test_blocks_share_no_row_and_hold_every_feature_once(n, d, density, seed):
    X = _random_csr(n, d, density, seed)
    block_of, n_blocks = feature_blocks(np, X.indptr.astype(np.int64), X.indices, d)
    held = np.bincount(X.indices, minlength=d) > 0
    # a feature with nonzeros is in one block, one without in none
    assert np.all((block_of >= 0) == held)
    assert set(np.unique(block_of[held])) == set(range(n_blocks))
    # no row holds two features of one block
    for i in range(n):
        blocks = block_of[X.indices[X.indptr[i]:X.indptr[i + 1]]]
        assert np.unique(blocks).size == blocks.size, i
    # at least as many blocks as the longest row's nonzeros
    assert n_blocks >= np.diff(X.indptr).max()


def test_one_hot_fields_are_one_block_each():
    X, starts = _one_hot_fields(500, [7, 30, 3, 12], seed=0)
    block_of, n_blocks = feature_blocks(np, X.indptr.astype(np.int64), X.indices, X.shape[1])
    assert n_blocks == 4
    field = np.searchsorted(starts, np.arange(X.shape[1]), side="right") - 1
    held = np.bincount(X.indices, minlength=X.shape[1]) > 0
    assert np.array_equal(block_of[held], field[held])


# --------------------------------------------------------------------------
# the sweeps against a reference: explicit loops over the features
# --------------------------------------------------------------------------
def _reference(X, y, s, *, draws, n_factors, n_sweeps, init_scale, fit_intercept,
               fit_linear, random_state, priors=MCMCPriors()):
    """Gibbs sampling written plainly: each feature's parameters from their
    conditional, built from the model's prediction recomputed over its
    rows, in the order of the blocks, features with no nonzero last (from
    their priors); ``draws="joint"``: a feature's weight and factors from
    one joint Gaussian, ``"single"``: one parameter at a time, as libFM
    draws them (and the features with no nonzero in both).  The same draws
    as :func:`fit_mcmc` takes (which this does not read)."""
    n, d = X.shape
    k = n_factors
    Xc = X.tocsc()
    seeds = np.random.SeedSequence(random_state).generate_state(2)
    rng = np.random.default_rng(seeds[0])
    dev = np.random.RandomState(seeds[1])
    block_of, n_blocks = feature_blocks(np, X.indptr.astype(np.int64), X.indices, d)
    order = [np.flatnonzero(block_of == b) for b in range(n_blocks)]
    if np.any(block_of < 0):
        order.append(np.flatnonzero(block_of < 0))
    dense = X.toarray()
    w0 = float(np.dot(s, y) / s.sum()) if fit_intercept else 0.0
    w = np.zeros(d)
    V = init_scale * dev.standard_normal((d, k)).reshape(d, k)

    def predict(i):
        x = dense[i]
        pair = 0.0
        for a in range(d):
            for b in range(a + 1, d):
                pair += np.dot(V[a], V[b]) * x[a] * x[b]
        return w0 + np.dot(w, x) + pair

    def rows_of(f):
        return Xc.indices[Xc.indptr[f]:Xc.indptr[f + 1]]

    alpha, mu_w, lam_w = 1.0, 0.0, 1.0
    mu_v, lam_v = np.zeros(k), np.ones(k)
    sums = [0.0, np.zeros(d), np.zeros((d, k))]
    curve = []

    def draw(feats, grad, param, mu, lam):
        """Each feature's parameter from its conditional, given the others."""
        z = dev.standard_normal(len(feats))
        new = []
        for j, f in enumerate(feats):
            rows = rows_of(f)
            h = np.array([grad(i, f) for i in rows])
            resid = np.array([y[i] - predict(i) for i in rows])
            theta = param(f)
            prec = alpha * np.sum(s[rows] * h * h) + lam
            num = alpha * np.sum(s[rows] * h * (resid + theta * h)) + mu * lam
            new.append(num / prec + z[j] / np.sqrt(prec))
        return np.array(new)

    def draw_single(feats):
        if fit_linear:
            w[feats] = draw(feats, lambda i, f: dense[i, f], lambda f: w[f], mu_w, lam_w)
        for c in range(k):
            def grad(i, f, c=c):
                x = dense[i]
                return x[f] * (np.dot(V[:, c], x) - V[f, c] * x[f])
            V[feats, c] = draw(feats, grad, lambda f, c=c: V[f, c], mu_v[c], lam_v[c])

    def h_of(i, f):
        """Feature f's parameters' coefficients in row i's prediction."""
        x = dense[i]
        pair = [x[f] * (np.dot(V[:, c], x) - V[f, c] * x[f]) for c in range(k)]
        return np.array(([x[f]] if fit_linear else []) + pair)

    def theta_of(f):
        return np.concatenate([[w[f]] if fit_linear else [], V[f]])

    def draw_joint(feats):
        """Each feature's (w_f, V_f) from its joint conditional given the
        others; the block's normals drawn at once."""
        mu = np.concatenate([[mu_w] if fit_linear else [], mu_v])
        lam = np.concatenate([[lam_w] if fit_linear else [], lam_v])
        p = mu.size
        z = dev.standard_normal(len(feats) * p).reshape(len(feats), p)
        new = []
        for j, f in enumerate(feats):
            rows = rows_of(f)
            h = np.array([h_of(i, f) for i in rows])
            resid = np.array([y[i] - predict(i) for i in rows]) + h @ theta_of(f)
            P = alpha * (h.T * s[rows]) @ h + np.diag(lam)
            b = alpha * h.T @ (s[rows] * resid) + lam * mu
            mean = np.linalg.solve(P, b)
            L = np.linalg.cholesky(P)
            new.append(mean + np.linalg.solve(L.T, z[j]))
        new = np.array(new).reshape(len(feats), p)
        if fit_linear:
            w[feats] = new[:, 0]
        V[feats] = new[:, 1 if fit_linear else 0:]

    for _ in range(n_sweeps):
        if fit_intercept:
            resid = np.array([y[i] - predict(i) for i in range(n)])
            prec = alpha * s.sum()
            w0 = w0 + np.dot(s, resid) / s.sum() + rng.normal() / np.sqrt(prec)
        for b, feats in enumerate(order):
            if draws == "joint" and b < n_blocks:
                draw_joint(feats)
            else:
                draw_single(feats)
        resid = np.array([y[i] - predict(i) for i in range(n)])
        sq = np.dot(s, resid ** 2)
        alpha = rng.gamma(priors.a0 + s.sum() / 2, 1 / (priors.b0 + sq / 2))

        def group(values, lam):
            p, g = values.size, priors.gamma0
            mu = rng.normal((values.sum() + g * priors.mu0) / (p + g), 1 / np.sqrt((p + g) * lam))
            rate = (priors.b_lambda + g * (mu - priors.mu0) ** 2
                    + np.sum((values - mu) ** 2)) / 2
            return mu, rng.gamma((priors.a_lambda + p + 1) / 2, 1 / rate)

        if fit_linear:
            mu_w, lam_w = group(w, lam_w)
        for c in range(k):
            mu_v[c], lam_v[c] = group(V[:, c], lam_v[c])
        sums[0] += w0
        sums[1] += w
        sums[2] += V
        curve.append(0.5 * sq / s.sum())
    return sums[0] / n_sweeps, sums[1] / n_sweeps, sums[2] / n_sweeps, curve


@pytest.mark.parametrize("draws", ["joint", "single"])
@pytest.mark.parametrize("fit_intercept, fit_linear, weighted", [
    (True, True, False), (True, True, True), (False, True, False), (True, False, True)])
def test_sweeps_match_the_plain_loops(draws, fit_intercept, fit_linear, weighted):
    # the last feature has no nonzero: drawn from its prior
    X = sp.hstack([_random_csr(25, 8, 0.35, seed=4), sp.csr_matrix((25, 1))], format="csr")
    rng = np.random.default_rng(5)
    y = rng.normal(size=25)
    s = rng.uniform(0.2, 3.0, 25) if weighted else np.ones(25)
    kw = dict(n_factors=3, n_sweeps=4, init_scale=0.3, fit_intercept=fit_intercept,
              fit_linear=fit_linear, random_state=11, draws=draws)
    got = fit_mcmc(np, X.indptr.astype(np.int64), X.indices, X.data, y, s, n_features=9, **kw)
    b, w, V, curve = _reference(X, y, s, **kw)
    np.testing.assert_allclose(got.intercept, b, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got.coef, w, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got.factors, V, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got.loss_curve, curve, rtol=1e-9)
    if not fit_linear:
        assert not np.any(got.coef)


def test_linear_model_is_bayesian_ridge():
    """Without factors the model is Bayesian linear regression: on a
    well-posed problem the mean of the draws is scikit-learn's
    ``BayesianRidge`` (which maximises the evidence instead of sampling the
    precisions, a difference the data's size makes small)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(500, 20))
    y = X @ (rng.normal(size=20) * (rng.random(20) < 0.3)) + 0.5 * rng.normal(size=500)
    Xs = sp.csr_matrix(X)
    got = fit_mcmc(np, Xs.indptr.astype(np.int64), Xs.indices, Xs.data, y, np.ones(500),
                   n_features=20, n_factors=0, n_sweeps=2000, init_scale=0.0,
                   random_state=0)
    ref = BayesianRidge().fit(X, y)
    np.testing.assert_allclose(got.coef, ref.coef_, atol=0.01)
    assert abs(got.intercept - ref.intercept_) < 0.01


# --------------------------------------------------------------------------
# the estimator
# --------------------------------------------------------------------------
def test_movielens_beats_the_stochastic_gradient_defaults(movielens_100k):
    Xa, ya, Xb, yb = movielens_100k

    def rmse(est):
        return np.sqrt(np.mean((est.fit(Xa, ya).predict(Xb) - yb) ** 2))

    mcmc = rmse(GPUFactorizationMachineRegressor(solver="mcmc", max_iter=200, random_state=0,
                                                 device="cpu"))
    adagrad = rmse(GPUFactorizationMachineRegressor(solver="adagrad", random_state=0,
                                                    device="cpu"))
    # measured: 0.911 against Adagrad's default 0.929 (libFM's MCMC: about 0.91)
    assert mcmc <= 0.915, mcmc
    assert mcmc < adagrad - 0.01, (mcmc, adagrad)
    # the defaults sample here (3.4 rows per parameter): 100 sweeps, 0.913
    est = GPUFactorizationMachineRegressor(random_state=0, device="cpu")
    default = rmse(est)
    assert est.solver_ == "mcmc" and est.n_iter_ == 100
    assert default <= 0.916 and default < adagrad - 0.01, (default, adagrad)


def test_units_of_y_do_not_matter():
    X, _ = _one_hot_fields(400, [20, 15], seed=1)
    y = np.random.default_rng(2).normal(size=400) + np.asarray(X[:, :5].sum(axis=1)).ravel()
    est = GPUFactorizationMachineRegressor(solver="mcmc", n_factors=2, max_iter=20,
                                           random_state=0, device="cpu")
    a = est.fit(X, y).predict(X)
    b = est.fit(X, 1000.0 * y + 7.0).predict(X)
    np.testing.assert_allclose(b, 1000.0 * a + 7.0, rtol=1e-4, atol=1e-2)
    assert est.n_iter_ == 20 and len(est.loss_curve_) == 20
    assert est.best_iteration_ is None and est.validation_score_.size == 0


def test_divergence_raises_and_a_model_worse_than_none_warns():
    """A value of X far too large: draws beyond float32 raise (with no
    numpy overflow warnings on the way, and the fitted model kept), and a
    fit that stays finite but ends worse than a constant warns."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    X, _ = _one_hot_fields(300, [12, 9, 5], seed=3)
    X = X.toarray()
    y = np.random.default_rng(3).normal(size=300) + X[:, :4].sum(axis=1)
    est = GPUFactorizationMachineRegressor(solver="mcmc", n_factors=2, max_iter=20,
                                           random_state=0, device="cpu").fit(X, y)
    coef = est.coef_.copy()
    huge = X.copy()
    huge[0, 0] = 1e30
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(ValueError, match="diverged.*solver='mcmc'.*Scale the features"):
            est.fit(huge, y)
    np.testing.assert_array_equal(est.coef_, coef)
    large = X.copy()
    large[0, 0] = 1e20  # (1e8 to 1e12 raise, as 1e30 does, at this seed)
    with pytest.warns(ConvergenceWarning, match="last sweep .* far above .* constant"):
        est.fit(large, y)


def test_no_partial_fit_and_no_classifier():
    est = GPUFactorizationMachineRegressor(solver="mcmc")
    assert not hasattr(est, "partial_fit")
    # the error says why and what to do
    with pytest.raises(AttributeError, match="'partial_fit' with solver='mcmc'.*Call fit, or "
                                             "use solver='adagrad'"):
        est.partial_fit(np.ones((3, 2)), np.ones(3))
    assert hasattr(GPUFactorizationMachineRegressor(), "partial_fit")
    with pytest.raises(InvalidParameterError, match="solver"):
        GPUFactorizationMachine(solver="mcmc").fit(np.eye(4), [0, 1, 0, 1])


def test_auto_rule_counts_rows_per_parameter_and_stored_entries():
    from sklearn_cuwide._mcmc import AUTO_MCMC_MAX_NONZEROS, suits_mcmc

    counts = np.array([3, 0, 1, 5])  # three features present
    assert suits_mcmc(27, counts, 9, n_factors=8)  # 27 rows, 27 parameters
    assert not suits_mcmc(26, counts, 9, n_factors=8)
    assert not suits_mcmc(10**6, counts, AUTO_MCMC_MAX_NONZEROS + 1, n_factors=8)
    assert not suits_mcmc(10, np.zeros(4, dtype=int), 0, n_factors=1)


def _auto_case(n, seed):
    """One-hot rows of two fields (61 features): 549 parameters at 8 factors."""
    X, _ = _one_hot_fields(n, [40, 21], seed=seed)
    y = np.random.default_rng(seed).normal(size=n) + np.asarray(X[:, :10].sum(axis=1)).ravel()
    return X, y


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "dense"])
def test_auto_samples_where_rows_outnumber_parameters(fmt):
    """solver="auto" fits the model solver="mcmc" fits where the rows at
    least equal the parameters of the features present, else Adagrad's,
    whatever the input's format; solver_ says which."""
    def fit(X, y, solver):
        X = X.toarray() if fmt == "dense" else X.asformat(fmt)
        return GPUFactorizationMachineRegressor(solver=solver, max_iter=5, tol=None,
                                                random_state=0, device="cpu").fit(X, y)

    for n, want in ((549, "mcmc"), (548, "adagrad")):
        X, y = _auto_case(n, seed=4)
        assert np.count_nonzero(np.bincount(X.indices, minlength=61)) == 61
        auto, explicit = fit(X, y, "auto"), fit(X, y, want)
        assert auto.solver_ == want and explicit.solver_ == want
        np.testing.assert_array_equal(auto.coef_, explicit.coef_)
        np.testing.assert_array_equal(auto.factors_, explicit.factors_)


def test_auto_caps_the_stored_entries(monkeypatch):
    from sklearn_cuwide import _fm

    X, y = _auto_case(2000, seed=5)
    est = GPUFactorizationMachineRegressor(max_iter=3, random_state=0, device="cpu")
    assert est.fit(X, y).solver_ == "mcmc"
    monkeypatch.setattr(_fm, "AUTO_MCMC_MAX_NONZEROS", X.nnz - 1)
    assert est.fit(X, y).solver_ == "adagrad"


def test_auto_continues_a_fitted_model_with_adagrad():
    """partial_fit and a warm_start fit continue the model with Adagrad,
    from the sampled model: one epoch of Adagrad from it, not a new model."""
    X, y = _auto_case(2000, seed=6)
    est = GPUFactorizationMachineRegressor(max_iter=20, random_state=0, device="cpu")
    sampled = est.fit(X, y).predict(X)
    assert est.solver_ == "mcmc"
    est.partial_fit(X, y)
    # the epochs counted from 1 after the sweeps, and their losses alone
    assert est.solver_ == "adagrad" and est.n_iter_ == 1 and len(est.loss_curve_) == 1
    est.partial_fit(X, y)
    assert est.n_iter_ == 2 and len(est.loss_curve_) == 2
    # a step from the sampled model: near it, unlike a new model's first epoch
    fresh = GPUFactorizationMachineRegressor(solver="adagrad", max_iter=1, tol=None,
                                             random_state=0, device="cpu").fit(X, y)
    moved = np.abs(est.predict(X) - sampled).mean()
    assert moved < 0.5 * np.abs(fresh.predict(X) - sampled).mean(), moved
    est.set_params(warm_start=True, max_iter=2, tol=None).fit(X, y)
    assert est.solver_ == "adagrad" and est.n_iter_ == 2
    # partial_fit of a new model: Adagrad
    new = GPUFactorizationMachineRegressor(random_state=0, device="cpu").partial_fit(X, y)
    assert new.solver_ == "adagrad"



@pytest.mark.parametrize("param", [dict(learning_rate=0.05), dict(alpha=1e-5),
                                   dict(beta=1e-4), dict(scale_penalty=False),
                                   dict(early_stopping=True)])
def test_auto_is_adagrad_where_a_parameter_only_it_reads_is_set(param, capsys):
    X, y = _auto_case(2000, seed=7)
    est = GPUFactorizationMachineRegressor(max_iter=2, tol=None, random_state=0,
                                           device="cpu", verbose=1)
    assert est.fit(X, y).solver_ == "mcmc"
    # 2000 rows, 61 features of 9 parameters
    assert ("solver 'mcmc' (3.64 rows per parameter of the 61 features present)"
            in capsys.readouterr().out)
    assert est.set_params(**param).fit(X, y).solver_ == "adagrad"
    name = next(iter(param))
    why = "early_stopping=True" if name == "early_stopping" else f"{name} set"
    assert f"solver 'adagrad' ({why})" in capsys.readouterr().out


def test_memory_is_planned_for_the_blocks():
    shape = _memory.FitShape(n_rows=10**6, n_features=2**20, nnz=4 * 10**7,
                             max_row_nnz=40, index_itemsize=4, value_itemsize=4,
                             n_outputs=1, n_heads=1, n_factors=8, solver="mcmc")
    needs = _memory.fit_needs(shape, "cuda")
    device = needs["device"]["training"]
    assert device["the blocks' nonzeros and their build"] == 64 * 4 * 10**7
    assert set(needs["host"]["training"]) == {"the fitted model (float64, then float32)"}
    plan = _memory.plan_fit(shape, "cuda", {"host": 2**40, "device": 2**20}, {})
    assert not plan.fits


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
def test_gpu_blocks_equal_the_cpu_blocks():
    import cupy as cp

    X = _random_csr(300, 50, 0.2, seed=6)
    a, na = feature_blocks(np, X.indptr.astype(np.int64), X.indices, 50)
    b, nb = feature_blocks(cp, cp.asarray(X.indptr.astype(np.int64)),
                           cp.asarray(X.indices), 50)
    assert na == nb
    np.testing.assert_array_equal(a, cp.asnumpy(b))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
def test_gpu_fit_scores_as_the_cpu_fit(movielens_100k):
    """Other draws (the device's generator), the same posterior: the test
    RMSE agrees within the spread of the CPU's seeds; a cupyx matrix fits
    as its host copy does."""
    import cupyx.scipy.sparse as cps

    Xa, ya, Xb, yb = movielens_100k
    kw = dict(solver="mcmc", max_iter=200, random_state=0)

    def rmse(est, X=Xa):
        return np.sqrt(np.mean((est.fit(X, ya).predict(Xb) - yb) ** 2))

    cpu = rmse(GPUFactorizationMachineRegressor(device="cpu", **kw))
    gpu = GPUFactorizationMachineRegressor(device="cuda", **kw)
    on_gpu = rmse(gpu)
    assert gpu.device_.startswith("cuda")
    from_cupyx = rmse(GPUFactorizationMachineRegressor(device="cuda", **kw),
                      cps.csr_matrix(Xa))
    assert abs(on_gpu - cpu) < 0.004, (on_gpu, cpu)
    assert abs(from_cupyx - on_gpu) < 0.004, (from_cupyx, on_gpu)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("kernel", [False, True], ids=["array-ops", "kernel"])
@pytest.mark.parametrize("fit_linear", [True, False])
def test_gpu_sweeps_match_the_cpu_sweeps_with_the_same_draws(monkeypatch, fit_linear, kernel):
    """The device's generator replaced by numpy's stream (copied to the
    device): the GPU's chain, of array operations or of the block kernel,
    is the CPU's to rounding, a feature with no nonzero included; run
    twice, it repeats its bits (no atomic sums)."""
    import cupy as cp

    from sklearn_cuwide._backends._cuda import mcmc_block_draw

    class HostStream:
        def __init__(self, seed):
            self.rs = np.random.RandomState(seed)

        def standard_normal(self, size):
            return cp.asarray(self.rs.standard_normal(size))

    X = sp.hstack([_random_csr(400, 30, 0.15, seed=7), sp.csr_matrix((400, 1))], format="csr")
    rng = np.random.default_rng(8)
    y, s = rng.normal(size=400), rng.uniform(0.2, 3.0, 400)
    kw = dict(n_features=31, n_factors=4, n_sweeps=6, init_scale=0.3, fit_linear=fit_linear,
              random_state=3)
    cpu = fit_mcmc(np, X.indptr.astype(np.int64), X.indices, X.data, y, s, draws="joint", **kw)
    args = [cp.asarray(a) for a in (X.indptr.astype(np.int64), X.indices, X.data, y, s)]
    monkeypatch.setattr(cp.random, "RandomState", HostStream)
    draw = mcmc_block_draw(4 + fit_linear) if kernel else None
    assert (draw is not None) == kernel
    gpu = [fit_mcmc(cp, *args, to_host=cp.asnumpy, block_draw=draw, **kw) for _ in range(2)]
    np.testing.assert_allclose(gpu[0].factors, cpu.factors, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(gpu[0].coef, cpu.coef, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(gpu[0].loss_curve, cpu.loss_curve, rtol=1e-7)
    np.testing.assert_array_equal(gpu[0].factors, gpu[1].factors)
    np.testing.assert_array_equal(gpu[0].coef, gpu[1].coef)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("lin, k", [(1, 0), (0, 1), (1, 8), (0, 16), (1, 32)])
def test_gpu_block_kernel_is_the_array_draw(lin, k):
    """One block's draw by ``cuwide_mcmc.cu`` against ``_draw_block``'s
    array operations on the same state and normals: features of one
    nonzero and of several batches of 32 (a column of 150 rows), weighted
    rows; every parameter, residual and factor sum to rounding."""
    import cupy as cp

    from sklearn_cuwide import _mcmc
    from sklearn_cuwide._backends._cuda import mcmc_block_draw

    n, m = 200, 12
    rng = np.random.default_rng(k + 10 * lin)
    # a block: each row holds one of its features (a one-hot field), feature
    # 0 holds 150 rows, feature 11 one
    feat_of_row = np.concatenate([np.zeros(150, int), 1 + rng.integers(0, 10, 49), [11]])
    rng.shuffle(feat_of_row)
    order = np.lexsort((np.arange(n), feat_of_row))
    local = feat_of_row[order]
    rows, x = order.astype(np.int64), rng.uniform(-2.0, 2.0, n)
    sr = rng.uniform(0.2, 3.0, n)
    d = 2 * m
    feats = np.sort(rng.choice(d, m, replace=False)).astype(np.int64)
    counts = np.bincount(local, minlength=m)
    ends = np.cumsum(counts)
    w0, V0 = rng.normal(size=d), rng.normal(size=(d, k))
    q0, e0 = rng.normal(size=(n, k)), rng.normal(size=n)
    p = lin + k
    z = rng.normal(size=(m, p))
    mu, lam = rng.normal(size=p), rng.uniform(0.5, 2.0, p)
    alpha = 1.7
    dev = [cp.asarray(a) for a in (w0, V0, q0, e0)]
    ref = [cp.asarray(a) for a in (w0, V0, q0, e0)]
    block = (cp.asarray(feats), cp.asarray(rows), cp.asarray(local), cp.asarray(x),
             cp.asarray(sr), [(0, m, 0, n, cp.asarray(ends), _mcmc._pair_groups(cp, p, n, 1 << 20))],
             None)
    _mcmc._draw_block(cp, block, cp.asarray(z), *ref, alpha=alpha, mu=cp.asarray(mu),
                      lam=cp.asarray(lam), lin=lin)
    draw = mcmc_block_draw(p)
    draw(cp.asarray(feats), cp.asarray(ends), cp.asarray(rows), cp.asarray(x), cp.asarray(sr),
         cp.asarray(z), *dev, alpha=alpha, mu=cp.asarray(mu), lam=cp.asarray(lam), lin=lin,
         jitter=_mcmc.JITTER)
    # to rounding: the array draw's sums are differences of running sums over
    # the block (each carries the rounding of the block's total), the
    # kernel's run over the feature's nonzeros alone; the solves amplify both
    for name, got, want in zip("wVqe", dev, ref):
        np.testing.assert_allclose(cp.asnumpy(got), cp.asnumpy(want), rtol=1e-8, atol=1e-10,
                                   err_msg=name)
    # the features outside the block are untouched
    outside = np.setdiff1d(np.arange(d), feats)
    np.testing.assert_array_equal(cp.asnumpy(dev[0])[outside], w0[outside])
    assert mcmc_block_draw(34) is None  # the array operations beyond 33 parameters


@pytest.mark.parametrize("draws", ["joint", "single"])
def test_a_weighted_row_is_its_copies(draws):
    """Where the rows outnumber the parameters, a row of weight k and its k
    copies give the same model to rounding (with fewer rows than
    parameters the joint chain amplifies rounding: test_sklearn_checks.py
    and docs/design/defaults.rst)."""
    X, _ = _one_hot_fields(600, [8, 6, 6], seed=1)
    rng = np.random.RandomState(42)
    y = rng.normal(size=600) + X[:, 0].toarray().ravel() * X[:, 8].toarray().ravel()
    sw = rng.randint(0, 5, size=600).astype(np.float64)
    rep = np.repeat(np.arange(600), sw.astype(int))
    kw = dict(n_features=X.shape[1], n_factors=8, n_sweeps=50, init_scale=0.01,
              random_state=0, draws=draws)

    def fit(X, y, s):
        return fit_mcmc(np, X.indptr.astype(np.int64), X.indices, X.data, y, s, **kw)

    weighted, copies = fit(X, y, sw), fit(X[rep], y[rep], np.ones(rep.size))
    np.testing.assert_allclose(weighted.factors, copies.factors, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(weighted.coef, copies.coef, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(weighted.loss_curve, copies.loss_curve, rtol=1e-8)


def test_chunks_bound_the_temporaries_and_do_not_change_the_draws(monkeypatch):
    """Chunks of features and groups of parameter pairs as small as they go
    draw the chain of one chunk a block."""
    from sklearn_cuwide import _mcmc

    X = _random_csr(300, 25, 0.2, seed=9)
    rng = np.random.default_rng(10)
    y = rng.normal(size=300)
    kw = dict(n_features=25, n_factors=3, n_sweeps=5, init_scale=0.3, random_state=4,
              draws="joint")
    args = (X.indptr.astype(np.int64), X.indices, X.data, y, np.ones(300))
    whole = fit_mcmc(np, *args, **kw)
    monkeypatch.setattr(_mcmc, "CHUNK_VALUES", {"host": 1, "device": 1})
    chunks = _mcmc._chunks(np.array([3, 5, 9]), 10, 16, 1)
    assert chunks == [(0, 1, 0, 3), (1, 2, 3, 5), (2, 3, 5, 9)]
    small = fit_mcmc(np, *args, **kw)
    np.testing.assert_allclose(small.factors, whole.factors, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(small.coef, whole.coef, rtol=1e-10, atol=1e-13)


def test_mcmc_warns_of_the_mini_batch_parameters_it_ignores():
    import warnings

    X, y = _auto_case(600, seed=8)
    est = GPUFactorizationMachineRegressor(solver="mcmc", max_iter=2, random_state=0,
                                           device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the defaults: nothing to say
        est.fit(X, y)
    with pytest.warns(UserWarning, match=r"does not use learning_rate, tol: they are ignored"):
        est.set_params(learning_rate=0.05, tol=None).fit(X, y)
    with pytest.warns(UserWarning, match=r"does not use batch_size: it is ignored \(.* read it\)"):
        est.set_params(learning_rate="auto", tol=1e-4, batch_size=64).fit(X, y)
    # "auto" that samples: says so, and warm_start is not ignored (the next
    # fit continues with Adagrad)
    auto = GPUFactorizationMachineRegressor(max_iter=2, random_state=0, device="cpu",
                                            warm_start=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        auto.fit(X, y)
    assert auto.solver_ == "mcmc"
    with pytest.warns(UserWarning, match=r"solver='auto' chose 'mcmc', which does not use "
                                         r"tol: it is ignored"):
        clone(auto).set_params(tol=None).fit(X, y)


def test_mcmc_warns_of_weights_that_hold_few_rows():
    """Weights normalised to sum to 1 hold one row's evidence: a warning says
    so, and how to scale them; weights of mean 1 say nothing."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    X, y = _auto_case(600, seed=8)
    est = GPUFactorizationMachineRegressor(solver="mcmc", max_iter=2, random_state=0,
                                           device="cpu")
    with pytest.warns(UserWarning, match=r"sample_weight sums to 1 over 600 rows.*scale them "
                                         r"to a mean of 1"):
        est.fit(X, y, sample_weight=np.full(600, 1 / 600))
    # a fit that ends worse than a constant names the weights, not the features
    with pytest.warns(ConvergenceWarning, match=r"worse than predicting a constant .*because "
                                                r"the sample weights hold the evidence of few"):
        est.set_params(max_iter=50).fit(X, y, sample_weight=np.full(600, 1 / 600))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est.fit(X, y, sample_weight=np.random.default_rng(0).uniform(0.5, 1.5, 600))
    # the class's defaults are the ones compared with
    params = GPUFactorizationMachineRegressor().get_params()
    from sklearn_cuwide._fm import _MCMC_UNUSED_DEFAULTS
    assert {k: params[k] for k in _MCMC_UNUSED_DEFAULTS} == _MCMC_UNUSED_DEFAULTS
