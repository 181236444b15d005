"""The CPU backend's mini-batch step against the slow float64 reference."""

import numpy as np
import pytest

from sklearn_cuwide._backends import _cpu
from sklearn_cuwide._solvers import batch_weights

from ._cases import CONFIGS, make_case
from ._reference import reference_epoch


def _run_cpu(layout, y, sw, state, params, order):
    ro = layout.row_order
    st = state.permute_features(layout.feature_order)
    loss = _cpu.run_epoch(
        layout, y[ro], sw[ro], batch_weights(layout, sw[ro]), st, params, order
    )
    return loss, st.permute_features(layout.feature_rank)


@pytest.mark.parametrize("cfg", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_cpu_epoch_matches_reference(cfg):
    rng = np.random.default_rng()
    X, y, sw, layout, state, params = make_case(rng, cfg)
    assert layout.n_hot > 0 and layout.n_sblocks > layout.n_batches
    order = rng.permutation(layout.n_batches)
    ref = {k: v.astype(np.float64).copy() for k, v in state.arrays().items()}
    ref_loss = reference_epoch(layout, y, sw, ref, params, order)
    loss, out = _run_cpu(layout, y, sw, state, params, order)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    for k, v in out.arrays().items():
        np.testing.assert_allclose(v, ref[k], rtol=2e-4, atol=2e-6, err_msg=k)


def test_untouched_features_do_not_move():
    rng = np.random.default_rng()
    X, y, sw, layout, state, params = make_case(rng, CONFIGS[4])
    absent = np.flatnonzero(np.diff(X.tocsc().indptr) == 0)
    assert absent.size
    before = state.V[absent].copy(), state.w[absent].copy()
    _, out = _run_cpu(layout, y, sw, state, params, np.arange(layout.n_batches))
    np.testing.assert_array_equal(out.V[absent], before[0])
    np.testing.assert_array_equal(out.w[absent], before[1])


@pytest.mark.parametrize("fm", [False, True])
def test_decision_function_of_a_few_rows_uses_their_features_only(fm):
    """A few rows against a wide model: computed on the rows of w and V of
    their features alone, the same values as the whole product (float64
    reference)."""
    import scipy.sparse as sp

    rng = np.random.default_rng(0)
    n_features = 5000
    X = sp.random(7, n_features, density=0.002, format="csr", random_state=1,
                  dtype=np.float32)
    X[3, 17] = 2.0  # a row of its own
    assert 4 * X.nnz < n_features
    w = rng.normal(size=(n_features, 2)).astype(np.float32)
    V = rng.normal(size=(n_features, 3)).astype(np.float32) if fm else None
    b = np.array([0.5, -1.0], dtype=np.float32)
    got = _cpu.decision_function(X, w, b, V)
    Xd = X.toarray().astype(np.float64)
    ref = Xd @ w.astype(np.float64) + b
    if fm:
        XV = Xd @ V.astype(np.float64)
        ref[:, 0] += 0.5 * ((XV**2).sum(1) - (Xd**2) @ (V.astype(np.float64) ** 2).sum(1))
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
