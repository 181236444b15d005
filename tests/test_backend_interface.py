"""The backend interface: both backends satisfy it, options are checked, and
one loss implementation serves every backend and solver."""

import ast
import inspect
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import expit, logsumexp

from sklearn_cuwide._backends import Backend, _cpu
from sklearn_cuwide._device import cuda_device_count
from sklearn_cuwide._loss import pointwise_loss
from sklearn_cuwide._state import StepParams

from ._cases import CONFIGS, make_case

CUDA_INIT = Path(__file__).resolve().parents[1] / "sklearn_cuwide" / "_backends" / "_cuda" / "__init__.py"


def _protocol_members():
    """The interface's attributes and functions."""
    methods = {n for n, v in vars(Backend).items() if not n.startswith("_") and callable(v)}
    return sorted(methods | set(Backend.__annotations__))


def _assert_satisfies(backend):
    """Every function of the interface is callable as it declares: its
    parameters in the backend's, in order and of the same kinds, and any
    other parameter of the backend's optional (a backend's own knobs, such
    as the CUDA layout's device budget, have defaults)."""
    assert isinstance(backend, Backend)
    for n in _protocol_members():
        want = getattr(Backend, n, None)
        if not callable(want):
            continue
        got = list(inspect.signature(getattr(backend, n)).parameters.values())
        params = list(inspect.signature(want).parameters.values())[1:]  # no self
        names = [p.name for p in got]
        assert all(p.name in names for p in params), (n, names)
        mine = [p for p in got if p.name in {q.name for q in params}]
        assert [p.name for p in mine] == [p.name for p in params], n
        assert [p.kind for p in mine] == [p.kind for p in params], n
        extra = [p for p in got if p.name not in {q.name for q in params}]
        assert all(p.default is not inspect.Parameter.empty for p in extra), (n, extra)


def test_cpu_backend_satisfies_the_interface():
    _assert_satisfies(_cpu)


def test_the_interface_check_refuses_what_a_caller_could_not_call():
    import types

    good = types.SimpleNamespace(**{n: getattr(_cpu, n) for n in dir(_cpu)
                                    if not n.startswith("_")})
    _assert_satisfies(good)
    for bad in (lambda layout, extra: None,  # a required parameter more
                lambda: None,  # the declared one missing
                lambda other: None):  # named otherwise
        broken = types.SimpleNamespace(**{**vars(good), "put_layout": bad})
        with pytest.raises(AssertionError):
            _assert_satisfies(broken)


def test_cpu_to_host_writes_into_out():
    a = np.arange(6.0).reshape(3, 2)
    assert _cpu.to_host(a) is a
    out = np.zeros_like(a)
    assert _cpu.to_host(a, out=out) is out
    np.testing.assert_array_equal(out, a)
    # as CuPy's get(out=): no broadcasting, no casting
    for bad in (np.zeros((3, 1)), np.zeros((3, 2), dtype=np.float32)):
        with pytest.raises(ValueError, match="out is"):
            _cpu.to_host(a, out=bad)


@pytest.mark.gpu
@pytest.mark.skipif(cuda_device_count() == 0, reason="needs a CUDA GPU")
def test_cuda_backend_satisfies_the_interface():
    from sklearn_cuwide._backends import get_backend

    _assert_satisfies(get_backend("cuda:0"))


def test_cuda_backend_exports_the_interface():
    """Read without importing cupy: the CUDA package's __all__ names every
    member of the interface."""
    tree = ast.parse(CUDA_INIT.read_text())
    exported = next(
        ast.literal_eval(node.value) for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__"
                                                for t in node.targets)
    )
    missing = set(_protocol_members()) - set(exported)
    assert not missing, missing


def test_cpu_run_epoch_refuses_concurrent_workers():
    rng = np.random.default_rng(0)
    X, y, sw, layout, state, params = make_case(rng, CONFIGS[0])
    bw = np.ones(layout.n_batches)
    with pytest.raises(ValueError, match="in order"):
        _cpu.run_epoch(layout, y, sw, bw, state, params, np.arange(layout.n_batches),
                       workers=4)
    with pytest.raises(TypeError):
        _cpu.run_epoch(layout, y, sw, bw, state, params, np.arange(layout.n_batches),
                       grid=4)


def test_cpu_holds_nothing_and_validates_like_scikit_learn():
    X = sp.random(5, 4, density=0.5, format="csr", random_state=0)
    assert not _cpu.holds(X)
    out = _cpu.validate_input(X.tocoo())
    assert sp.isspmatrix_csr(out) and out.has_canonical_format
    bad = X.toarray()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="Input X contains NaN"):
        _cpu.validate_input(bad, estimator_name="GPULogisticRegression")
    assert _cpu.concurrent_blocks("max", StepParams(), 1000) == 1


@pytest.mark.parametrize("loss", ["logistic", "multinomial", "squared"])
def test_pointwise_loss_against_scipy(loss):
    """The one loss against scipy's formulas in float64, far into the tails."""
    rng = np.random.default_rng()
    n, D = 200, 1 if loss != "multinomial" else 4
    Z = rng.normal(scale=30.0, size=(n, D))
    if loss == "logistic":
        y = rng.integers(0, 2, n).astype(np.float64)
        ref = np.logaddexp(0, Z[:, 0]) - y * Z[:, 0]
        dref = (expit(Z[:, 0]) - y)[:, None]
    elif loss == "squared":
        y = rng.normal(size=n)
        ref, dref = 0.5 * (Z[:, 0] - y) ** 2, (Z[:, 0] - y)[:, None]
    else:
        y = rng.integers(0, D, n).astype(np.float64)
        lse = logsumexp(Z, axis=1)
        ref = lse - Z[np.arange(n), y.astype(int)]
        dref = np.exp(Z - lse[:, None])
        dref[np.arange(n), y.astype(int)] -= 1
    lo, d = pointwise_loss(np, Z, y, loss)
    assert np.all(np.isfinite(lo)) and np.all(np.isfinite(d))
    np.testing.assert_allclose(lo, ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(d, dref, rtol=1e-12, atol=1e-12)


def test_pointwise_loss_refuses_an_unknown_loss():
    with pytest.raises(ValueError, match="unknown loss"):
        pointwise_loss(np, np.zeros((2, 1)), np.zeros(2), "hinge")


def test_cpu_csr_in_layout_order_is_the_canonical_column_gather():
    rng = np.random.default_rng(3)
    X = sp.random(50, 20, density=0.3, format="csr", random_state=2)
    order = rng.permutation(20)
    rank = np.argsort(order)
    got = _cpu.csr_in_layout_order(X, order, rank)
    assert got.has_canonical_format
    np.testing.assert_array_equal(got.toarray(), X.toarray()[:, order])
