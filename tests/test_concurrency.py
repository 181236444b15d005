"""The ``concurrency`` parameter: its resolution into thread blocks (a pure
rule, checked here on the CPU), its validation, and that the CPU backend,
which always runs the mini-batches in order, is not changed by it."""

import numpy as np
import pytest

from sklearn_cuwide import (
    GPUFactorizationMachine,
    GPUFactorizationMachineRegressor,
    GPULogisticRegression,
)
from sklearn_cuwide._backends import _concurrency as cc

from .conftest import make_sparse_problem

FULL = 264  # an H200: 132 multiprocessors x 2 blocks


@pytest.mark.parametrize("n_batches, expected", [
    (1, 1), (31, 1), (32, 2), (16 * 100 + 15, 100), (16 * FULL, FULL), (10**7, FULL),
])
def test_grid_for_keeps_min_batches_per_block(n_batches, expected):
    assert cc.grid_for(n_batches, FULL) == expected
    assert n_batches // cc.grid_for(n_batches, FULL) >= min(n_batches, cc.MIN_BATCHES_PER_BLOCK)


@pytest.mark.parametrize("model, solver, large, small", [
    ("linear", "adagrad", FULL, 6),   # lock-free sums measured lossless
    ("linear", "sgd", 1, 1),          # sgd loses accuracy already at 2 blocks
    ("fm", "adagrad", 1, 1),          # in order, each step on the whole grid
    ("fm", "sgd", 1, 1),
])
def test_auto_blocks(model, solver, large, small):
    assert cc.blocks("auto", model, solver, 10**6, FULL) == large
    assert cc.blocks("auto", model, solver, 100, FULL) == small  # 100 // 16


def test_max_and_int():
    assert cc.blocks("max", "fm", "sgd", 10**6, FULL) == FULL
    assert cc.blocks("max", "fm", "adagrad", 100, FULL) == 6
    assert cc.blocks(1, "linear", "adagrad", 10**6, FULL) == 1
    assert cc.blocks(32, "fm", "adagrad", 10**6, FULL) == 32
    assert cc.blocks(10**6, "fm", "adagrad", 10**6, FULL) == FULL
    assert cc.blocks(32, "fm", "adagrad", 100, FULL) == 6
    for bad in (0, -1, "fast", 2.0, True, None):
        with pytest.raises(ValueError, match="concurrency"):
            cc.blocks(bad, "fm", "adagrad", 10**6, FULL)


@pytest.mark.parametrize("Est", [
    GPULogisticRegression, GPUFactorizationMachine, GPUFactorizationMachineRegressor,
])
@pytest.mark.parametrize("bad", [0, -3, "fast", 1.5])
def test_estimators_reject_bad_concurrency(Est, bad):
    X, y = make_sparse_problem(2)
    est = Est(concurrency=bad, device="cpu", max_iter=2)
    if Est is GPULogisticRegression:
        est.set_params(solver="adagrad")
    with pytest.raises(ValueError, match="concurrency"):
        est.fit(X, y)


@pytest.mark.parametrize("Est, kw", [
    (GPULogisticRegression, dict(solver="adagrad")),
    (GPULogisticRegression, dict(solver="sgd")),
    (GPUFactorizationMachine, dict(n_factors=4)),
])
def test_cpu_runs_in_order_whatever_the_concurrency(Est, kw):
    X, y = make_sparse_problem(2, seed=1)
    fits = [Est(device="cpu", max_iter=3, random_state=0, concurrency=c, **kw).fit(X, y)
            for c in ("auto", "max", 1, 7)]
    for f in fits[1:]:
        np.testing.assert_array_equal(f.coef_, fits[0].coef_)


@pytest.mark.parametrize("workers, expected", [
    (1, 8), (4, 8), (33, 8), (34, 4), (66, 4), (67, 2), (132, 2), (133, 1), (244, 1),
    (264, 1), (500, 1),
])
def test_cluster_for_fills_the_device_with_the_fewest_workers(workers, expected):
    # an H200: 132 SMs x 2 blocks
    cl = cc.cluster_for(workers, 264)
    assert cl == expected
    assert workers * cl <= 264 or cl == 1


def test_cluster_for_without_clusters_is_one_block():
    # before compute capability 9.0 the CUDA backend passes sizes (1,)
    assert [cc.cluster_for(w, 216, (1,)) for w in (1, 4, 216)] == [1, 1, 1]
