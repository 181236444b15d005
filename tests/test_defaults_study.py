"""The defaults study's pieces (benchmarks/defaults_study.py) on tiny data."""

import json

import numpy as np
import pytest

from benchmarks import defaults_study as ds


def test_halves_are_disjoint_and_cover_the_sets():
    assert not set(ds.CHOOSE) & set(ds.CONFIRM)
    assert set(ds.CHOOSE) | set(ds.CONFIRM) == set(ds.SETS)
    assert len(ds.SETS) >= 8
    assert ds.AUTO_THRESHOLD == __import__(
        "sklearn_cuwide._minibatch", fromlist=["x"]).EARLY_STOPPING_AUTO_MIN_SAMPLES


def test_stopping_epoch_is_the_best_before_patience_runs_out():
    # best at 3; 4 and 5 fail to improve; patience 2 stops at 5
    assert ds.stopping_epoch([0.5, 0.4, 0.3, 0.31, 0.32, 0.1], n_iter_no_change=2) == 3
    # a later, better epoch is found while patience lasts
    assert ds.stopping_epoch([0.5, 0.4, 0.3, 0.31, 0.2], n_iter_no_change=2) == 5
    assert ds.stopping_epoch([0.5], n_iter_no_change=5) == 1
    # a loss falling by less than tol an epoch, but by more than tol over
    # the patience's epochs, runs on
    slow = [0.5 - 4e-5 * e for e in range(12)]
    assert ds.stopping_epoch(slow, n_iter_no_change=3, tol=1e-4) == 12
    assert ds.stopping_epoch(slow, n_iter_no_change=2, tol=1e-4) == 3


def test_stopping_epoch_matches_the_estimators_rule():
    """The study's reading of a validation curve keeps the epoch an
    early-stopped fit keeps: a fit of many epochs, its curve cut by the
    study's rule, against the estimator's own stop."""
    from sklearn_cuwide import GPULogisticRegression
    from sklearn_cuwide.datasets import make_ctr_classification

    X, y = make_ctr_classification(12000, 2**10, n_fields=6, n_numeric=2, random_state=0)
    kw = dict(solver="adagrad", early_stopping=True, device="cpu", random_state=0)
    est = GPULogisticRegression(tol=1e-3, n_iter_no_change=2, max_iter=60, **kw).fit(X, y)
    assert est.n_iter_[0] < 60  # stopped by the rule
    long = GPULogisticRegression(tol=None, max_iter=est.n_iter_[0] + 3, **kw).fit(X, y)
    curve = -long.validation_score_
    assert ds.stopping_epoch(curve, n_iter_no_change=2, tol=1e-3) == est.best_iteration_


def test_tol_rule_epoch_matches_the_estimators_rule():
    from sklearn_cuwide import GPULogisticRegression
    from sklearn_cuwide.datasets import make_ctr_classification

    X, y = make_ctr_classification(3000, 2**10, n_fields=6, n_numeric=2, random_state=0)
    est = GPULogisticRegression(solver="adagrad", tol=1e-2, n_iter_no_change=2,
                                max_iter=50, early_stopping=False, device="cpu",
                                random_state=0).fit(X, y)
    long = GPULogisticRegression(solver="adagrad", tol=0.0, n_iter_no_change=50,
                                 max_iter=est.n_iter_[0] + 3, early_stopping=False,
                                 device="cpu", random_state=0).fit(X, y)
    assert ds.tol_rule_epoch(long.loss_curve_, 50, n_iter_no_change=2,
                             tol=1e-2) == est.n_iter_[0]


def test_epoch_curves_match_a_fit_of_that_many_epochs():
    split = ds.load_set("syn_fm_10f", size="tiny")
    st = ds._setting("fm", learning_rate=0.1, alpha=0.0, beta=0.0, scale_penalty=False,
                     init_scale=0.01, batch_size=1024)
    c = ds.epoch_curves(split, st, 3)
    assert len(c["train_loss"]) == len(c["val_loss"]) == len(c["test"]) == 3
    # the curve's third epoch is a 3-epoch fit on the same rows
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import train_test_split

    Xtr, _, ytr, _ = train_test_split(split.X_train, split.y_train, test_size=0.1,
                                      stratify=split.y_train, random_state=0)
    est = ds._estimator(st, "binary", 0).set_params(max_iter=3, tol=None,
                                                     early_stopping=False)
    est.fit(Xtr, ytr)
    auc = roc_auc_score(split.y_test, est.decision_function(split.X_test))
    assert auc == pytest.approx(c["test"][2], abs=1e-6)


def test_regrets_and_choice():
    def rec(s, key, test):
        return dict(set=s, task="binary", key=key,
                    curves=dict(test=test, val_loss=[-t for t in test],
                                train_loss=[1.0] * len(test), n_train=90_000))

    recs = [rec("a", "x", [0.70, 0.72]), rec("a", "y", [0.71, 0.70]),
            rec("b", "x", [0.60, 0.61]), rec("b", "y", [0.65, 0.64])]
    r = ds.regrets(recs, ("fixed", 1))
    assert r["x"]["a"] == pytest.approx(0.02) and r["y"]["b"] == pytest.approx(0.0)
    # early stopping on the validation curve (here the test curve) picks each
    # run's best epoch: "y" wins on the mean
    assert ds.choose(recs, ("es", 5), ["a", "b"]) == "y"


def test_tiny_study_runs_end_to_end(tmp_path):
    out = tmp_path / "study"
    argv = ["--size", "tiny", "--out", str(out), "--sets", "syn_fm_10f,syn_reg_10f"]
    assert ds.main(argv + ["--stage", "baselines,confirm,report"]) == 0
    confirm = [json.loads(s) for s in (out / "confirm.jsonl").read_text().splitlines()]
    assert {r["key"] for r in confirm} == {"fm", "lr_adagrad", "lr_lbfgs", "fm_reg"}
    assert all(np.isfinite(r.get("auc", r.get("rmse"))) for r in confirm)
    report = (out / "report.md").read_text()
    assert "syn_fm_10f" in report and "syn_reg_10f" in report
