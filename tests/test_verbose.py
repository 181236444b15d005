"""``verbose=1``: one line per stage of a fit, each with its own time, in the
order the fit goes through them, then one line for the whole fit; for every
estimator and solver, ``fit`` and ``partial_fit``.

The format and the order of the lines are tested, never the timings' values
(speed is the benchmarks' business): a fake clock makes each line's span one
second where a test needs numbers.
"""

import re
import types
import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from sklearn_cuwide import (
    GPUFactorizationMachine,
    GPUFactorizationMachineRegressor,
    GPULogisticRegression,
    _state,
)
from sklearn_cuwide._device import cuda_device_count
from sklearn_cuwide._state import FitProgress

from .conftest import make_sparse_problem
from .test_fit_integrity import _Clock

STAGE = re.compile(r"^Stage: (.+?) in (\d+\.\d{3}) s(?: \(kernels \d+\.\d{3} s\))?"
                   r"(?:: learning_rate [\d.e+-]+(?:, alpha [\d.e+-]+, beta [\d.e+-]+)?"
                   r"|: solver '(?:adagrad|mcmc)' \([^()]+\))?$")
EPOCH = re.compile(r"^(?:Model (\d+) of (\d+), )?[Ee]poch (\d+)/(\d+) in \d+\.\d{3} s"
                   r"(?: \(kernels \d+\.\d{3} s\))?: loss [-\d.e+]+(?:, validation loss "
                   r"[-\d.e+]+)?, [\d,]+ samples/s, \d+\.\d{2} s since the fit began$")
ITERATIONS = re.compile(r"^Iterations? (\d+)(?:-(\d+))? in \d+\.\d{3} s"
                        r"(?: \(kernels \d+\.\d{3} s\))?: loss [\d.]+, "
                        r"[\d,]+ samples/s, \d+\.\d{2} s since the fit began$")
FIT = re.compile(r"^Fit: \d+\.\d{3} s on (?:cpu|cuda:\d+), ([\d,]+) samples processed "
                 r"\(rows times passes over them\), [\d,]+ samples/s$")
STOPPED = re.compile(r"^(?:Model \d+ of \d+, s|S)topped after epoch (\d+): (?:the "
                     r"validation loss of the last \d+ epochs did not improve on the "
                     r"epochs before by tol=\S+|"
                     r"max_iter=\d+ epochs reached); the model of epoch (\d+) "
                     r"\(best_iteration_\), validation loss [\d.]+, is kept$")


@pytest.fixture(scope="module")
def binary():
    return make_sparse_problem(2)


@pytest.fixture(scope="module")
def multiclass():
    return make_sparse_problem(3)


def _parse(out):
    """The lines as ``(kind, value)``: ("stage", name), ("epoch", (head,
    epoch)), ("iterations", (first, last)), ("fit", samples)."""
    parsed = []
    for ln in out.splitlines():
        for kind, rx in (("stage", STAGE), ("epoch", EPOCH), ("iterations", ITERATIONS),
                         ("fit", FIT), ("stopped", STOPPED)):
            m = rx.match(ln)
            if m:
                break
        else:
            raise AssertionError(f"a line of no known format: {ln!r}")
        if kind == "stage":
            parsed.append((kind, m.group(1)))
        elif kind == "epoch":
            parsed.append((kind, (int(m.group(1) or 1), int(m.group(3)))))
        elif kind == "stopped":
            parsed.append((kind, int(m.group(1))))
        elif kind == "iterations":
            parsed.append((kind, (int(m.group(1)), int(m.group(2) or m.group(1)))))
        else:
            parsed.append((kind, int(m.group(1).replace(",", ""))))
    return parsed


#: the stages that copy to the backend and back, by device: the CPU's copy
#: nothing and say what they do instead
COPIES = {"cpu": ("model in layout order", "model in feature order"),
          "cuda": ("upload", "model back")}


def _minibatch_lines(heads, epochs, early_stopping=False, device="cpu"):
    """The lines a mini-batch fit on ``device`` prints, in order."""
    to_backend, back = COPIES[device]
    out = [("stage", "input checks")]
    if early_stopping:
        out.append(("stage", "validation split"))
    out += [("stage", "step parameters"), ("stage", "layout")]
    for h in range(1, heads + 1):
        prefix = "" if heads == 1 else f"model {h} of {heads}, "
        out += [("stage", prefix + "initial state"), ("stage", prefix + to_backend)]
        out += [("epoch", (h, e)) for e in range(1, epochs + 1)]
        if early_stopping:  # why the epochs ended, and the model kept
            out.append(("stopped", epochs))
        out.append(("stage", prefix + back))
    return out + [("stage", "attributes")]


MINIBATCH = {
    "lr-sgd": lambda: GPULogisticRegression(solver="sgd", max_iter=3, tol=0.0,
                                            device="cpu"),
    "lr-adagrad": lambda: GPULogisticRegression(solver="adagrad", max_iter=3, tol=0.0,
                                                device="cpu"),
    "fm": lambda: GPUFactorizationMachine(n_factors=2, max_iter=3, tol=None, random_state=0,
                                          device="cpu"),
    "fm-regressor": lambda: GPUFactorizationMachineRegressor(
        n_factors=2, max_iter=3, tol=None, learning_rate=0.01, random_state=0, device="cpu"),
}


@pytest.mark.parametrize("early_stopping", [False, True])
@pytest.mark.parametrize("name", list(MINIBATCH))
def test_minibatch_fit_prints_every_stage_in_order(name, early_stopping, binary, capsys):
    X, y = binary
    est = MINIBATCH[name]().set_params(verbose=1, early_stopping=early_stopping)
    est.fit(X, y)
    lines = _parse(capsys.readouterr().out)
    assert lines[:-1] == _minibatch_lines(1, 3, early_stopping)
    # the whole fit: the rows trained on, once per epoch
    n_train = X.shape[0] - (int(np.ceil(0.1 * X.shape[0])) if early_stopping else 0)
    assert lines[-1] == ("fit", 3 * n_train)


def test_one_vs_rest_fm_prints_each_models_stages(multiclass, capsys):
    X, y = multiclass
    MINIBATCH["fm"]().set_params(verbose=1).fit(X, y)
    lines = _parse(capsys.readouterr().out)
    assert lines[:-1] == _minibatch_lines(3, 3)
    assert lines[-1] == ("fit", 3 * 3 * X.shape[0])


@pytest.mark.parametrize("name", list(MINIBATCH))
def test_partial_fit_prints_one_epoch(name, binary, capsys):
    X, y = binary
    est = MINIBATCH[name]().set_params(verbose=1)
    if name == "fm-regressor":
        est.partial_fit(X, y)
    else:
        est.partial_fit(X, y, classes=np.unique(y))
    lines = _parse(capsys.readouterr().out)
    assert lines[:-1] == _minibatch_lines(1, 1)
    assert lines[-1] == ("fit", X.shape[0])


@pytest.mark.parametrize("early_stopping", [False, True])
def test_regressor_prints_its_losses_in_the_units_of_y(binary, capsys, early_stopping):
    """The regressor trains on a standardised target; its lines print the
    losses as ``loss_curve_`` and ``validation_score_`` give them, in the
    units of ``y`` (a target 100 times larger prints losses 10,000 times
    larger), the early-stopping summary's too."""
    X, y = binary
    y = np.asarray(y, dtype=float) * 100.0 + 3.0
    est = MINIBATCH["fm-regressor"]().set_params(verbose=1, early_stopping=early_stopping)
    est.fit(X, y)
    out = capsys.readouterr().out
    epochs = [ln for ln in out.splitlines() if ln.startswith("Epoch")]
    printed = [float(re.search(r": loss ([\d.e+-]+)", ln).group(1)) for ln in epochs]
    np.testing.assert_allclose(printed, est.loss_curve_, rtol=1e-5)
    if early_stopping:
        val = [float(re.search(r"validation loss ([\d.e+-]+)", ln).group(1)) for ln in epochs]
        np.testing.assert_allclose(val, -np.asarray(est.validation_score_), rtol=1e-5)
        kept = re.search(r"validation loss ([\d.]+), is kept", out).group(1)
        best = est.best_iteration_
        assert float(kept) == pytest.approx(-est.validation_score_[best - 1], rel=1e-5)
    assert min(printed) > 10.0  # not the standardised target's share of its variance


def test_epoch_lines_count_up_to_max_iter(binary, capsys):
    X, y = binary
    GPULogisticRegression(solver="adagrad", max_iter=4, tol=0.0, verbose=1,
                          device="cpu").fit(X, y)
    epochs = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("Epoch")]
    assert [ln.split(" in ")[0] for ln in epochs] == [f"Epoch {k}/4" for k in range(1, 5)]


@pytest.mark.parametrize("verbose, per_line", [(1, 10), (2, 1)])
def test_lbfgs_prints_a_line_per_ten_iterations_or_each(binary, capsys, verbose, per_line):
    X, y = binary
    est = GPULogisticRegression(verbose=verbose, max_iter=35, tol=1e-12, device="cpu")
    est.fit(X, y)
    lines = _parse(capsys.readouterr().out)
    n_iter = int(est.n_iter_[0])
    assert n_iter > 20  # enough iterations for several lines
    assert lines[:2] == [("stage", "input checks"), ("stage", "objective")]
    # the CPU's coefficients are host arrays already: no stage brings them back
    assert lines[-2:-1] == [("stage", "attributes")]
    assert lines[-1][0] == "fit"
    spans = [v for k, v in lines[2:-2]]
    assert all(k == "iterations" for k, _ in lines[2:-2])
    # consecutive spans cover the iterations once, the first alone
    assert spans[0] == (1, 1)
    assert [a for a, _ in spans[1:]] == [b + 1 for _, b in spans[:-1]]
    assert spans[-1][1] == n_iter
    assert all(b - a + 1 <= per_line for a, b in spans)
    assert all(b % per_line == 0 for _, b in spans[1:-1])


def test_not_verbose_prints_nothing(binary, capsys):
    X, y = binary
    for make in MINIBATCH.values():
        make().fit(X, y)
    GPULogisticRegression(max_iter=5, device="cpu").fit(X, y)
    assert capsys.readouterr().out == ""


# --------------------------------------------------------------------------
# FitProgress itself
# --------------------------------------------------------------------------
def test_each_line_has_its_own_span_and_the_last_the_whole_fit(capsys, monkeypatch):
    monkeypatch.setattr(_state, "time", types.SimpleNamespace(perf_counter=_Clock()))
    p = FitProgress(verbose=1)  # t = 1
    p.stage("input checks")  # t = 2
    p.step("Epoch 1/2", "loss 0.5", 100)  # t = 3
    p.step("Epoch 2/2", "loss 0.4", 100)  # t = 4
    p.stage("model back")  # t = 5
    p.finish(device="cuda:0")  # t = 6 (attributes), 7 (the total: 6 s)
    assert capsys.readouterr().out.splitlines() == [
        "Stage: input checks in 1.000 s",
        "Epoch 1/2 in 1.000 s: loss 0.5, 50 samples/s, 2.00 s since the fit began",
        "Epoch 2/2 in 1.000 s: loss 0.4, 67 samples/s, 3.00 s since the fit began",
        "Stage: model back in 1.000 s",
        "Stage: attributes in 1.000 s",
        "Fit: 6.000 s on cuda:0, 200 samples processed (rows times passes over them), "
        "33 samples/s",
    ]


def test_iterations_are_grouped_and_flushed_by_the_next_stage(capsys, monkeypatch):
    monkeypatch.setattr(_state, "time", types.SimpleNamespace(perf_counter=_Clock()))
    p = FitProgress(verbose=1)
    for it in range(1, 26):
        p.iteration(it, f"loss {1 / it:.6f}", 10)
    p.stage("coefficients back")
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(" in ")[0] for ln in lines] == [
        "Iteration 1", "Iterations 2-10", "Iterations 11-20", "Iterations 21-25",
        "Stage: coefficients back"]
    assert lines[3].startswith("Iterations 21-25 in 1.000 s: loss 0.040000, ")
    assert p.samples == 250


def test_a_stage_named_none_prints_nothing_and_its_span_joins_the_next(capsys, monkeypatch):
    monkeypatch.setattr(_state, "time", types.SimpleNamespace(perf_counter=_Clock()))
    p = FitProgress(verbose=1)  # t = 1
    p.stage(None)  # nothing printed, the clock not read
    p.stage("attributes")  # t = 2
    assert capsys.readouterr().out.splitlines() == ["Stage: attributes in 1.000 s"]


def test_a_span_that_compiled_kernels_says_so(capsys, monkeypatch):
    seconds = iter([0.0, 0.0, 1.5, 1.5])
    monkeypatch.setattr(_state, "_kernel_seconds", lambda: next(seconds))
    p = FitProgress(verbose=1)  # 0.0
    p.stage("layout")  # 0.0: nothing compiled
    p.step("Epoch 1/1", "loss 0.5", 10)  # 1.5: the epoch compiled its kernels
    p.stage("model back")  # 1.5
    lines = capsys.readouterr().out.splitlines()
    assert "kernels" not in lines[0] and "kernels" not in lines[2]
    assert re.match(r"^Epoch 1/1 in \d+\.\d{3} s \(kernels 1\.500 s\): loss 0\.5, ", lines[1])
    assert EPOCH.match(lines[1])



@pytest.mark.parametrize("max_iter,n_iter_no_change,why", [
    (50, 2, "the validation loss of the last 2 epochs did not improve on the epochs "
            "before by tol=0.0001"),
    (3, 5, "max_iter=3 epochs reached"),
])
def test_early_stopping_says_why_it_stopped_and_what_it_kept(binary, capsys, max_iter,
                                                             n_iter_no_change, why):
    X, y = binary
    est = GPUFactorizationMachine(n_factors=2, early_stopping=True, verbose=1,
                                  max_iter=max_iter, n_iter_no_change=n_iter_no_change,
                                  random_state=0, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(X, y)
    stopped = [ln for ln in capsys.readouterr().out.splitlines()
               if ln.startswith("Stopped")]
    assert stopped == [
        f"Stopped after epoch {est.n_iter_}: {why}; the model of epoch "
        f"{est.best_iteration_} (best_iteration_), validation loss "
        f"{-est.validation_score_[est.best_iteration_ - 1]:.6f}, is kept"]


@pytest.mark.parametrize("dask", [False, True])
def test_the_training_loss_rule_says_when_it_stopped(binary, capsys, dask):
    """Without a validation split, a fit the training-loss rule stops before
    max_iter says so once (one process, and the Dask estimators); one that
    runs all max_iter epochs says nothing of the kind."""
    X, y = binary
    kw = dict(n_factors=2, early_stopping=False, verbose=1, tol=10.0, n_iter_no_change=2,
              random_state=0, device="cpu")
    if dask:
        distributed = pytest.importorskip("distributed")
        from sklearn_cuwide.dask import GPUFactorizationMachine as Dask

        with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                      dashboard_address=None) as cluster, \
                distributed.Client(cluster) as client:
            import dask.array as da

            est = Dask(client=client, max_iter=50, **kw).fit(
                da.from_array(X, chunks=(X.shape[0], X.shape[1])),
                da.from_array(y, chunks=y.shape[0]))
    else:
        est = GPUFactorizationMachine(max_iter=50, **kw).fit(X, y)
    out = capsys.readouterr().out.splitlines()
    # a tol of 10 is never met: the first epoch sets the best, then the rule
    # stops after 2 epochs without improving on it by tol
    assert est.n_iter_ == 3
    assert [ln for ln in out if ln.startswith("Stopped")] == [
        "Stopped after epoch 3: no improvement of the training loss by tol=10 for 2 "
        "epochs; the last epoch's model is kept"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        GPUFactorizationMachine(max_iter=2, **kw).fit(X, y)
    assert not [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("Stopped")]


def test_a_parts_lines_are_prefixed_from_verbose_2_and_its_rows_count_in_the_fit(capsys):
    """FitProgress.part (each fit of the penalty choice): its lines start
    with the prefix and print from verbose=2 only; its rows count in the
    whole fit's samples either way."""
    for verbose, shown in ((1, False), (2, True)):
        whole = FitProgress(verbose)
        part = whole.part("[multiplier 3] ")
        part.stage("layout")
        part.step("Epoch 1/1", "loss 0.5", 10)
        whole.step("Epoch 1/1", "loss 0.4", 5)
        whole.finish()
        out = capsys.readouterr().out
        assert ("[multiplier 3] Stage: layout in" in out) is shown
        assert ("[multiplier 3] Epoch 1/1 in" in out) is shown
        assert "\nEpoch 1/1 in" in out or out.startswith("Epoch 1/1 in")
        assert " 15 samples processed" in out


# --------------------------------------------------------------------------
# GPU twins: the copies' own stages
# --------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(cuda_device_count() == 0, reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", list(MINIBATCH))
def test_gpu_minibatch_fit_prints_its_upload_and_model_back(name, binary, capsys):
    X, y = binary
    MINIBATCH[name]().set_params(verbose=1, device="cuda", early_stopping=True).fit(X, y)
    lines = _parse(capsys.readouterr().out)
    assert lines[:-1] == _minibatch_lines(1, 3, True, device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(cuda_device_count() == 0, reason="needs a CUDA GPU")
def test_gpu_lbfgs_prints_its_coefficients_back(binary, capsys):
    GPULogisticRegression(verbose=1, max_iter=5, device="cuda").fit(*binary)
    lines = _parse(capsys.readouterr().out)
    assert lines[-3:-1] == [("stage", "coefficients back"), ("stage", "attributes")]
