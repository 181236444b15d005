"""The estimators inside scikit-learn's tools: pipelines with a vectorizer or
a one-hot encoder, grid search (serial and parallel), cross-validation,
clone, pickle and joblib."""

import io
import pickle

import joblib
import numpy as np
import pytest
import scipy.sparse as sp
from numpy.testing import assert_allclose, assert_array_equal
from sklearn.base import clone
from sklearn.feature_extraction.text import HashingVectorizer, TfidfVectorizer
from sklearn.model_selection import GridSearchCV, cross_val_score, train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder

from sklearn_cuwide import (
    GPUFactorizationMachine,
    GPUFactorizationMachineRegressor,
    GPULogisticRegression,
)

_TOPICS = {
    "sports": "ball goal team score match player coach league win season referee".split(),
    "science": "atom cell energy theory data lab experiment physics gene protein".split(),
    "cooking": "oven salt butter recipe flour sugar bake pan garlic onion".split(),
}
_COMMON = "the a of and to in is it that for with on as was".split()


def _corpus(n_docs=300, seed=0):
    rng = np.random.default_rng(seed)
    labels = np.array(sorted(_TOPICS))[rng.integers(0, len(_TOPICS), n_docs)]
    docs = []
    for lab in labels:
        n_topic = rng.integers(2, 5)
        words = list(rng.choice(_TOPICS[lab], n_topic)) + list(rng.choice(_COMMON, 8))
        # a few words of another topic: not separable by one word
        other = rng.choice([t for t in _TOPICS if t != lab])
        words += list(rng.choice(_TOPICS[other], rng.integers(0, 3)))
        rng.shuffle(words)
        docs.append(" ".join(words))
    return np.array(docs, dtype=object), labels


def _categorical(n=3000, seed=0):
    """User, item and context ids with a planted interaction; ids as strings."""
    rng = np.random.default_rng(seed)
    users, items = rng.integers(0, 40, n), rng.integers(0, 30, n)
    ctx = rng.integers(0, 3, n)
    U, V = rng.normal(size=(40, 3)), rng.normal(size=(30, 3))
    y = (U[users] * V[items]).sum(1) + 0.3 * ctx + rng.normal(scale=0.3, size=n)
    X = np.column_stack([
        np.char.add("u", users.astype(str)),
        np.char.add("i", items.astype(str)),
        np.char.add("c", ctx.astype(str)),
    ]).astype(object)
    return X, y


@pytest.fixture(scope="module")
def fitted_models():
    rng = np.random.default_rng(0)
    X = sp.random(200, 30, density=0.2, format="csr", random_state=rng)
    y = (np.asarray(X.sum(axis=1)).ravel() > 1.0).astype(int)
    y3 = rng.integers(0, 3, 200)
    yr = np.asarray(X.sum(axis=1)).ravel()
    models = [
        GPULogisticRegression(device="cpu").fit(X, y),
        GPULogisticRegression(device="cpu").fit(X, y3),
        GPULogisticRegression(solver="adagrad", max_iter=5, random_state=0,
                              device="cpu").fit(X, y),
        GPUFactorizationMachine(n_factors=4, max_iter=5, random_state=0,
                                device="cpu").fit(X, y),
        GPUFactorizationMachine(n_factors=4, max_iter=5, random_state=0,
                                device="cpu").fit(X, y3),
        GPUFactorizationMachineRegressor(n_factors=4, max_iter=5, random_state=0,
                                         device="cpu").fit(X, yr),
    ]
    return X, models


def _outputs(est, X):
    out = [est.predict(X)]
    if hasattr(est, "predict_proba"):
        out += [est.predict_proba(X), est.decision_function(X)]
    return out


# --------------------------------------------------------------------------
# pipelines
# --------------------------------------------------------------------------
def test_pipeline_tfidf_logistic_regression():
    docs, labels = _corpus()
    d_tr, d_te, y_tr, y_te = train_test_split(docs, labels, random_state=0)
    pipe = make_pipeline(TfidfVectorizer(), GPULogisticRegression(C=10.0, device="cpu"))
    pipe.fit(d_tr, y_tr)
    assert set(pipe.classes_) == set(_TOPICS)
    assert pipe.score(d_te, y_te) > 0.9
    assert pipe.predict_proba(d_te).shape == (len(d_te), 3)


@pytest.mark.parametrize("est", [
    GPULogisticRegression(solver="adagrad", random_state=0, device="cpu"),
    GPUFactorizationMachine(n_factors=4, random_state=0, device="cpu"),
])
def test_pipeline_hashing_vectorizer(est):
    docs, labels = _corpus()
    d_tr, d_te, y_tr, y_te = train_test_split(docs, labels, random_state=0)
    pipe = make_pipeline(HashingVectorizer(n_features=2**12), est)
    pipe.fit(d_tr, y_tr)
    assert pipe.score(d_te, y_te) > 0.9


def test_pipeline_one_hot_fm_regressor():
    X, y = _categorical()
    X_tr, X_te, y_tr, y_te = train_test_split(X, y, random_state=0)
    pipe = make_pipeline(
        OneHotEncoder(handle_unknown="ignore"),
        GPUFactorizationMachineRegressor(n_factors=4, beta=1e-4, random_state=0,
                                         device="cpu"),
    )
    pipe.fit(X_tr, y_tr)
    # the interaction is most of the signal: a linear model cannot reach this
    assert pipe.score(X_te, y_te) > 0.8
    # factors that start at zero stay there under the mini-batch solver
    lin = make_pipeline(OneHotEncoder(handle_unknown="ignore"),
                        GPUFactorizationMachineRegressor(solver="adagrad", n_factors=1,
                                                         init_scale=0.0, device="cpu"))
    assert lin.fit(X_tr, y_tr).score(X_te, y_te) < 0.3


def test_pipeline_one_hot_classifier():
    X, y = _categorical(seed=1)
    yc = np.where(y > np.median(y), "high", "low")
    X_tr, X_te, y_tr, y_te = train_test_split(X, yc, random_state=0, stratify=yc)
    pipe = make_pipeline(OneHotEncoder(handle_unknown="ignore"),
                         GPUFactorizationMachine(n_factors=4, random_state=0,
                                                 device="cpu"))
    assert pipe.fit(X_tr, y_tr).score(X_te, y_te) > 0.8
    # the label depends on an interaction: logistic regression cannot see it
    lr = make_pipeline(OneHotEncoder(handle_unknown="ignore"),
                       GPULogisticRegression(device="cpu"))
    assert lr.fit(X_tr, y_tr).score(X_te, y_te) < 0.7


# --------------------------------------------------------------------------
# model selection
# --------------------------------------------------------------------------
@pytest.mark.parametrize("n_jobs", [1, 2])
def test_grid_search(n_jobs):
    docs, labels = _corpus(seed=1)
    pipe = make_pipeline(TfidfVectorizer(), GPULogisticRegression(device="cpu"))
    grid = GridSearchCV(
        pipe,
        {"gpulogisticregression__C": [0.01, 10.0],
         "gpulogisticregression__solver": ["lbfgs", "adagrad"]},
        cv=3,
        n_jobs=n_jobs,
    ).fit(docs, labels)
    assert grid.best_params_["gpulogisticregression__C"] == 10.0
    assert grid.best_score_ > 0.85
    scores = grid.cv_results_["mean_test_score"]
    assert np.all(np.isfinite(scores))


def test_grid_search_parallel_equals_serial():
    rng = np.random.default_rng(0)
    X = sp.random(300, 40, density=0.2, format="csr", random_state=rng)
    y = (np.asarray(X.sum(axis=1)).ravel() > 1.6).astype(int)
    est = GPUFactorizationMachine(n_factors=3, max_iter=10, random_state=0,
                                  device="cpu")
    params = {"beta": [1e-4, 1e-2], "solver": ["sgd", "adagrad"]}
    s1 = GridSearchCV(est, params, cv=3, n_jobs=1, scoring="roc_auc").fit(X, y)
    s2 = GridSearchCV(est, params, cv=3, n_jobs=2, scoring="roc_auc").fit(X, y)
    assert_allclose(s1.cv_results_["mean_test_score"], s2.cv_results_["mean_test_score"])
    assert_array_equal(s1.best_estimator_.factors_, s2.best_estimator_.factors_)


@pytest.mark.parametrize("est, scoring", [
    (GPULogisticRegression(device="cpu"), "accuracy"),
    (GPULogisticRegression(solver="sgd", random_state=0, device="cpu"), "roc_auc"),
    (GPUFactorizationMachine(n_factors=4, random_state=0, device="cpu"), "neg_log_loss"),
])
def test_cross_val_score_classifiers(est, scoring):
    rng = np.random.default_rng(0)
    X = sp.random(300, 40, density=0.2, format="csr", random_state=rng)
    y = (np.asarray(X.sum(axis=1)).ravel() > 1.6).astype(int)
    scores = cross_val_score(est, X, y, cv=3, scoring=scoring)
    assert scores.shape == (3,)
    assert np.all(np.isfinite(scores))
    if scoring == "roc_auc":
        assert scores.min() > 0.8


def test_cross_val_score_regressor():
    X, y = _categorical()
    pipe = make_pipeline(OneHotEncoder(handle_unknown="ignore"),
                         GPUFactorizationMachineRegressor(n_factors=4, beta=1e-4,
                                                          random_state=0,
                                                          device="cpu"))
    scores = cross_val_score(pipe, X, y, cv=3)
    assert scores.min() > 0.7


# --------------------------------------------------------------------------
# clone, pickle, joblib
# --------------------------------------------------------------------------
def test_clone(fitted_models):
    _, models = fitted_models
    for est in models:
        c = clone(est)
        assert type(c) is type(est)
        assert c.get_params() == est.get_params()
        assert not hasattr(c, "coef_") and not hasattr(c, "device_")


def test_pickle_round_trip(fitted_models):
    X, models = fitted_models
    for est in models:
        loaded = pickle.loads(pickle.dumps(est))
        for a, b in zip(_outputs(est, X), _outputs(loaded, X)):
            assert_array_equal(a, b)


def test_joblib_round_trip(fitted_models, tmp_path):
    X, models = fitted_models
    for i, est in enumerate(models):
        path = tmp_path / f"model{i}.joblib"
        joblib.dump(est, path)
        loaded = joblib.load(path)
        for a, b in zip(_outputs(est, X), _outputs(loaded, X)):
            assert_array_equal(a, b)
    buf = io.BytesIO()
    joblib.dump(models[3], buf, compress=3)
    buf.seek(0)
    assert_array_equal(joblib.load(buf).factors_, models[3].factors_)


def test_gpu_state_is_not_pickled_and_gpu_models_predict_on_cpu(fitted_models):
    """A model fitted on a GPU carries its device arrays in ``_gpu*``
    attributes; they are dropped by pickling, and the model predicts where
    there is no GPU (or no cupy)."""
    X, models = fitted_models
    for est in models:
        expected = _outputs(est, X)
        gpu_model = pickle.loads(pickle.dumps(est))
        gpu_model.device_ = "cuda:0"  # as if fitted on a GPU
        gpu_model._gpu_cache = {"src": (), "heads": lambda: None}  # unpicklable
        gpu_model._gpu_extra = lambda: None
        loaded = pickle.loads(pickle.dumps(gpu_model))
        assert not any(k.startswith("_gpu") for k in vars(loaded))
        assert loaded.device_ == "cuda:0"
        for a, b in zip(expected, _outputs(loaded, X)):
            assert_allclose(a, b, rtol=1e-5, atol=1e-6)
