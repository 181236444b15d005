"""The input checks a GPU fit makes on its device copy of a host CSR matrix
(``_base.DeferredScans``): every index in range, every value finite and
within float32's range.  They raise the host checks' messages word for
word, before any training step, and leave the model of clean data as the
host checks do.

On the CPU the deferral is forced (``_base._scans_on_device`` and the size
threshold patched): the CPU backend's arrays stand for the device copy,
which exercises the fits' plumbing; the GPU tests (marker ``gpu``) run the
real one, through the staged upload and the L-BFGS upload.
"""

import re

import numpy as np
import pytest
import scipy.sparse as sp
from numpy.testing import assert_array_equal

from sklearn_cuwide import (
    GPUFactorizationMachine,
    GPUFactorizationMachineRegressor,
    GPULogisticRegression,
)
from sklearn_cuwide import _base
from sklearn_cuwide._device import cuda_device_count

from .test_validation import _clean_data, _matrix_bytes, corrupt_arrays, host_matrix


def _cases(device):
    """Every solver, without the fits that choose a penalty on rows of X
    (they check X on the host first: their own test below)."""
    return {
        "lr-lbfgs": lambda: GPULogisticRegression(device=device),
        "lr-adagrad": lambda: GPULogisticRegression(solver="adagrad", C=1.0, max_iter=2,
                                                    concurrency=1, random_state=0,
                                                    device=device),
        "lr-sgd": lambda: GPULogisticRegression(solver="sgd", C=1.0, max_iter=2,
                                                concurrency=1, random_state=0,
                                                device=device),
        "fm": lambda: GPUFactorizationMachine(n_factors=3, alpha=1e-5, beta=1e-4,
                                              max_iter=2, concurrency=1, random_state=0,
                                              device=device),
        "fm-regressor": lambda: GPUFactorizationMachineRegressor(
            n_factors=3, alpha=1e-5, beta=1e-4, max_iter=2, concurrency=1,
            random_state=0, device=device),
    }


CPU_CASES = _cases("cpu")
#: (fault, its kind): the range check's faults (corrupt_arrays') and the values'
FAULTS = ["index-over", "index-huge", "index-negative", "nan", "inf", "beyond-float32"]


def _target(name, y):
    return y.astype(np.float64) if name == "fm-regressor" else y


def _faulty(fault):
    """A float64 CSR matrix with one fault, its labels, and the message's
    regular expression."""
    X, y = _clean_data()
    X = X.astype(np.float64)
    if fault.startswith("index"):
        arrays, msg = corrupt_arrays(X, "csr", fault)
        return host_matrix("csr", X.shape, arrays), y, msg
    X = X.copy()
    X.data[X.nnz // 2] = {"nan": np.nan, "inf": np.inf, "beyond-float32": 1e39}[fault]
    msg = {"nan": re.escape("Input X contains NaN."),
           "inf": re.escape("Input X contains infinity"),
           "beyond-float32": re.escape("Input X contains a value of magnitude 1e+39, "
                                       "beyond the range of float32")}[fault]
    return X, y, msg


def _defer_everywhere(monkeypatch):
    """Defer the scans on the CPU backend too, for any number of entries;
    returns the list the deferred checks append their kind to."""
    monkeypatch.setattr(_base, "_scans_on_device", lambda backend: True)
    monkeypatch.setattr(_base, "DEVICE_SCAN_MIN_NNZ", 0)
    calls = []
    for kind in ("on_host", "on_device"):
        real = getattr(_base.DeferredScans, kind)

        def spy(self, *a, _real=real, _kind=kind, **k):
            calls.append(_kind)
            return _real(self, *a, **k)

        monkeypatch.setattr(_base.DeferredScans, kind, spy)
    return calls


def _forbid_training(monkeypatch):
    """Make every training step fail if it is reached."""
    import sklearn_cuwide._backends._cpu as cpu
    import sklearn_cuwide._logistic as lr_module

    def forbidden(name):
        def f(*args, **kwargs):
            raise AssertionError(f"{name} ran before the input check failed")
        return f

    monkeypatch.setattr(cpu, "build_layout", forbidden("build_layout"))
    monkeypatch.setattr(cpu, "run_epoch", forbidden("run_epoch"))
    monkeypatch.setattr(lr_module, "fit_lbfgs_linear", forbidden("fit_lbfgs_linear"))


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("name", list(CPU_CASES))
def test_deferred_scans_raise_the_host_checks_messages(name, fault, monkeypatch):
    X, y, msg = _faulty(fault)
    before = _matrix_bytes(X)
    with pytest.raises(ValueError, match=msg):  # the host checks, at once
        CPU_CASES[name]().fit(X, _target(name, y))
    calls = _defer_everywhere(monkeypatch)
    _forbid_training(monkeypatch)
    est = CPU_CASES[name]()
    with pytest.raises(ValueError, match=msg):
        est.fit(X, _target(name, y))
    # L-BFGS checks its uploaded copy; the mini-batch fits without a staged
    # copy (the CPU's) check on the host before anything reads X
    assert calls[0] == ("on_device" if name == "lr-lbfgs" else "on_host")
    assert _matrix_bytes(X) == before
    assert not hasattr(est, "coef_") and not hasattr(est, "n_features_in_")


@pytest.mark.parametrize("name", list(CPU_CASES))
def test_deferred_scans_of_clean_data_give_the_same_model(name, monkeypatch):
    X, y = _clean_data()
    y = _target(name, y)
    a = CPU_CASES[name]().fit(X, y)
    calls = _defer_everywhere(monkeypatch)
    b = CPU_CASES[name]().fit(X, y)
    assert calls
    for attr in ("coef_", "intercept_", "factors_"):
        if hasattr(a, attr):
            assert_array_equal(getattr(a, attr), getattr(b, attr), err_msg=attr)


@pytest.mark.parametrize("name, make", [
    ("lr-adagrad", lambda: GPULogisticRegression(solver="adagrad", max_iter=2,
                                                 random_state=0, device="cpu")),
    ("fm", lambda: GPUFactorizationMachine(n_factors=3, max_iter=2, random_state=0,
                                           device="cpu")),
], ids=["lr-c-choice", "fm-penalty-choice"])
def test_fits_that_choose_on_rows_check_on_the_host_first(name, make, monkeypatch):
    """``C="auto"`` and the FM's "auto" penalties fit rows of X to choose:
    the checks run on the host before them."""
    X, y, msg = _faulty("nan")
    calls = _defer_everywhere(monkeypatch)
    _forbid_training(monkeypatch)
    with pytest.raises(ValueError, match=msg):
        make().fit(X, y)
    assert calls == ["on_host"]


def test_the_device_check_names_the_fault_in_the_users_matrix():
    """The device copy may be canonical (rows sorted, another entry order):
    the fault it finds is named at its place in the user's matrix."""
    from sklearn_cuwide._backends import get_backend

    X, _ = _clean_data()
    arrays, msg = corrupt_arrays(X, "csr", "index-over")
    bad = host_matrix("csr", X.shape, arrays)
    scans = _base.DeferredScans(GPULogisticRegression(), bad)
    order = np.random.default_rng(0).permutation(bad.nnz)
    with pytest.raises(ValueError, match=msg):
        scans.on_device(get_backend("cpu"), bad.indices[order], bad.data[order])
    scans = _base.DeferredScans(GPULogisticRegression(), X)
    scans.on_device(get_backend("cpu"), X.indices, X.data)  # clean: nothing raised


def test_only_large_host_csr_on_a_device_is_deferred(monkeypatch):
    from sklearn_cuwide._backends import get_backend

    X, _ = _clean_data()
    est, cpu = GPULogisticRegression(), get_backend("cpu")
    assert _base._deferred_scans(est, X, cpu) is None  # the CPU's arrays are the host's
    monkeypatch.setattr(_base, "_scans_on_device", lambda backend: True)
    assert _base._deferred_scans(est, X, cpu) is None  # too few entries
    monkeypatch.setattr(_base, "DEVICE_SCAN_MIN_NNZ", X.nnz)
    assert isinstance(_base._deferred_scans(est, X, cpu), _base.DeferredScans)
    # formats whose conversion reads the indices, and values converted first
    for other in (X.tocsc(), X.tocoo(), X.astype(np.int64), X.toarray()):
        assert _base._deferred_scans(est, other, cpu) is None


# --------------------------------------------------------------------------
# on the GPU: the staged upload's copy and L-BFGS's
# --------------------------------------------------------------------------
GPU_CASES = _cases("cuda")
needs_gpu = pytest.mark.skipif(cuda_device_count() == 0, reason="needs a CUDA GPU")


def _gpu_defer(monkeypatch):
    """The real deferral (a CUDA backend), for any number of entries; the
    list of the deferred checks' kinds as they run."""
    monkeypatch.setattr(_base, "DEVICE_SCAN_MIN_NNZ", 0)
    calls = []
    real = _base.DeferredScans.on_device
    monkeypatch.setattr(_base.DeferredScans, "on_device",
                        lambda self, *a, **k: calls.append("on_device") or real(self, *a, **k))
    return calls


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("name", list(GPU_CASES))
def test_gpu_deferred_scans_raise_the_host_checks_messages(name, fault, monkeypatch):
    from sklearn_cuwide._backends import _cuda

    X, y, msg = _faulty(fault)
    before = _matrix_bytes(X)
    calls = _gpu_defer(monkeypatch)
    ran = []
    real_epoch = _cuda.run_epoch
    monkeypatch.setattr(_cuda, "run_epoch",
                        lambda *a, **k: ran.append(1) or real_epoch(*a, **k))
    est = GPU_CASES[name]()
    with pytest.raises(ValueError, match=msg):
        est.fit(X, _target(name, y))
    assert calls == ["on_device"]  # found on the device copy, named by the host's check
    assert not ran
    assert _matrix_bytes(X) == before
    assert not hasattr(est, "n_features_in_")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("name", list(GPU_CASES))
def test_gpu_deferred_scans_of_clean_data_give_the_same_model(name, monkeypatch):
    """One worker: equal to the float32 rounding of the kernels' atomic
    additions, as scipy and cupyx input are."""
    X, y = _clean_data()
    y = _target(name, y)
    a = GPU_CASES[name]().fit(X, y)
    calls = _gpu_defer(monkeypatch)
    b = GPU_CASES[name]().fit(X, y)
    assert calls == ["on_device"]
    for attr in ("coef_", "intercept_", "factors_"):
        if hasattr(a, attr):
            np.testing.assert_allclose(getattr(a, attr), getattr(b, attr),
                                       rtol=1e-4, atol=1e-6, err_msg=attr)


# --------------------------------------------------------------------------
# prediction: the copy its upload makes
# --------------------------------------------------------------------------
def _fitted(name, device):
    X, y = _clean_data()
    return _cases(device)[name]().fit(X, _target(name, y))


def _forbid_scoring(monkeypatch, module):
    """Make the backend's decision kernel fail if it is reached."""
    def forbidden(*args, **kwargs):
        raise AssertionError("decision_function ran before the input check failed")

    monkeypatch.setattr(module, "decision_function", forbidden)


PREDICT_CASES = ["lr-adagrad", "fm", "fm-regressor"]
#: the CPU backend with the deferral forced (its arrays stand for the copy),
#: and the real one
PREDICT_DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, needs_gpu])]


def _predict_defer(device, monkeypatch):
    """The deferral for any number of entries on ``device``, and the
    deferred checks' kinds as they will be recorded for a fault (on the
    CPU both spied: the device check calls the host's)."""
    if device == "cpu":
        return _defer_everywhere(monkeypatch), ["on_device", "on_host"]
    return _gpu_defer(monkeypatch), ["on_device"]


def _scores(est, X):
    return est.predict_proba(X) if hasattr(est, "predict_proba") else est.predict(X)


@pytest.mark.parametrize("device", PREDICT_DEVICES)
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("name", PREDICT_CASES)
def test_predict_deferred_scans_raise_the_host_checks_messages(name, fault, device,
                                                               monkeypatch):
    from sklearn_cuwide._backends import get_backend

    est = _fitted(name, device)
    X, _, msg = _faulty(fault)
    before = _matrix_bytes(X)
    with pytest.raises(ValueError, match=msg):  # the host checks, at once
        est.predict(X)
    calls, found = _predict_defer(device, monkeypatch)
    _forbid_scoring(monkeypatch, get_backend(est.device_))
    with pytest.raises(ValueError, match=msg):
        est.predict(X)
    assert calls == found  # found on the copy, named by the host's check
    assert _matrix_bytes(X) == before


@pytest.mark.parametrize("device", PREDICT_DEVICES)
@pytest.mark.parametrize("name", PREDICT_CASES)
def test_predict_deferred_scans_of_clean_data_give_the_same_values(name, device, monkeypatch):
    est = _fitted(name, device)
    X, _ = _clean_data()
    a = _scores(est, X)
    calls, _ = _predict_defer(device, monkeypatch)
    assert_array_equal(_scores(est, X), a)
    assert calls == ["on_device"]
