"""The CUDA backend's full reductions in two passes
(``_backends/_cuda/_reduce.py``) against numpy's one-pass reductions: the
CPU tests drive the module with numpy (it imports no cupy; it is loaded from
its file, since its package's ``__init__`` imports cupy), with small
thresholds so that both passes and the rows' remainder run; the GPU tests
(marker ``gpu``) with cupy at its own thresholds, against cupy's one pass.
"""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from sklearn_cuwide._device import cuda_device_count

ROOT = Path(__file__).resolve().parents[1]
OPS = ("all", "any", "max", "min", "sum")


def _reduce_module():
    path = ROOT / "sklearn_cuwide" / "_backends" / "_cuda" / "_reduce.py"
    spec = importlib.util.spec_from_file_location("sklearn_cuwide._backends._cuda._reduce",
                                                  path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def small():
    """The module with two passes from 64 items, over 8 rows."""
    mod = _reduce_module()
    mod.TWO_PASS_ITEMS, mod.ROWS = 64, 8
    return mod


def _arrays(rng, n):
    return {
        "float32": rng.standard_normal(n).astype(np.float32),
        "float64 2-d": rng.standard_normal((n // 3 + 1, 3)),
        "int64": rng.integers(-1000, 1000, n),
        "bool": rng.random(n) < 0.5,
    }


@pytest.mark.parametrize("n", [1, 63, 64, 65, 100, 1000, 1003])
@pytest.mark.parametrize("op", OPS)
def test_reduce_all_is_numpys_reduction(small, n, op):
    rng = np.random.default_rng(n)
    for name, a in _arrays(rng, n).items():
        got, want = small.reduce_all(np, a, op), getattr(a, op)()
        assert got.shape == () and got.dtype == want.dtype, name
        if a.dtype.kind == "f" and op == "sum":
            np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=name)
        else:
            assert got == want, name


@pytest.mark.parametrize("where", [0, 40, 499, 1002])  # a row's first, inside, the last rows
def test_one_odd_item_decides_anywhere(small, where):
    a = np.ones(1003, dtype=bool)
    a[where] = False
    assert not small.reduce_all(np, a, "all")
    assert small.reduce_all(np, ~a, "any")
    x = np.zeros(1003)
    x[where] = 7.0
    assert small.reduce_all(np, x, "max") == 7.0
    assert small.reduce_all(np, -x, "min") == -7.0


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", [0, 500, 1002])
def test_all_finite_finds_one_bad_value(small, bad, where):
    V = np.random.default_rng(0).standard_normal((1003, 4)).astype(np.float32)
    assert small.all_finite(np, V)
    V.reshape(-1)[4 * where + 3] = bad
    assert not small.all_finite(np, V)


@pytest.mark.gpu
@pytest.mark.skipif(cuda_device_count() == 0, reason="needs a CUDA GPU")
@pytest.mark.parametrize("op", OPS)
def test_gpu_reduce_all_is_cupys_one_pass(op):
    import cupy as cp

    mod = _reduce_module()
    n = mod.TWO_PASS_ITEMS + 12_345  # two passes and a remainder
    rng = cp.random.default_rng(1)
    for a in (rng.standard_normal(n, dtype=cp.float32), rng.random((n // 16 + 1, 16)) < 0.5,
              cp.arange(n, dtype=cp.int64) % 1001 - 500):
        got, want = mod.reduce_all(cp, a, op), getattr(a, op)()
        if a.dtype.kind == "f" and op == "sum":
            cp.testing.assert_allclose(got, want, rtol=1e-4)
        else:
            assert bool(got == want)


@pytest.mark.gpu
@pytest.mark.skipif(cuda_device_count() == 0, reason="needs a CUDA GPU")
@pytest.mark.parametrize("where", [0, "last row", "remainder"])
def test_gpu_all_finite_finds_one_nan(where):
    import cupy as cp

    mod = _reduce_module()
    n = mod.TWO_PASS_ITEMS + 777
    V = cp.zeros(n, dtype=cp.float32)
    assert mod.all_finite(cp, V)
    i = {0: 0, "last row": mod.ROWS * (n // mod.ROWS) - 1, "remainder": n - 1}[where]
    V[i] = cp.nan
    assert not mod.all_finite(cp, V)


@pytest.mark.gpu
@pytest.mark.skipif(cuda_device_count() == 0, reason="needs a CUDA GPU")
@pytest.mark.parametrize("where", [None, 0, "last row", "remainder"])
def test_gpu_holds_zero_finds_one_zero(where):
    """The CUDA backend's ``holds_zero`` (the stored zeros' check of a
    device CSR's values, two passes at this size) against the CPU
    backend's, which finds it in numpy."""
    import cupy as cp

    from sklearn_cuwide._backends import _cpu, _cuda

    mod = _reduce_module()
    n = mod.TWO_PASS_ITEMS + 777
    V = np.full(n, 0.5, dtype=np.float32)
    if where is not None:
        V[{0: 0, "last row": mod.ROWS * (n // mod.ROWS) - 1, "remainder": n - 1}[where]] = 0.0
    assert _cuda.holds_zero(cp.asarray(V)) is _cpu.holds_zero(V) is (where is not None)
