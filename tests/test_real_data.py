"""Tests of the real-data loaders in ``benchmarks/data.py``.

Two parts: the parsers on tiny files written here in each format (always
run, checked against straightforward per-row reference parsers), and every
real dataset in the shared data directory (skipped when absent): sizes from
its SOURCE.md, the CSR contract, and a scikit-learn model that reaches a
sane score.
"""

import math
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.metrics import mean_squared_error, roc_auc_score

from benchmarks import data as real_data  # noqa: E402

DATA = real_data.data_dir()
AVAILABLE = set(real_data.available_datasets())


def check_contract(ds):
    """CSR float32, canonical, int32 indices, same width, labels as promised."""
    for X, y in ((ds.X_train, ds.y_train), (ds.X_test, ds.y_test)):
        assert sp.issparse(X) and X.format == "csr"
        assert X.dtype == np.float32
        assert X.indices.dtype == np.int32 and X.indptr.dtype == np.int32
        assert X.shape[0] == y.shape[0] > 0
        assert np.all(np.isfinite(X.data)) and np.all(X.data != 0)
        # sorted, duplicate-free, checked on the raw arrays
        for i in range(0, X.shape[0], max(1, X.shape[0] // 200)):
            cols = X.indices[X.indptr[i] : X.indptr[i + 1]]
            assert np.all(np.diff(cols) > 0)
        assert X.indices.size == 0 or X.indices.max() < X.shape[1]
        if ds.task == "binary":
            assert y.dtype == np.int64 and set(np.unique(y)) <= {0, 1}
        elif ds.task == "regression":
            assert y.dtype == np.float64
    assert ds.X_train.shape[1] == ds.X_test.shape[1] == ds.n_features
    if ds.task == "binary":
        assert set(np.unique(ds.y_train)) == {0, 1}


# --------------------------------------------------------------------------
# resolution and errors
# --------------------------------------------------------------------------
def test_data_dir_env_var(monkeypatch, tmp_path):
    monkeypatch.setenv(real_data.ENV_VAR, str(tmp_path))
    assert real_data.data_dir() == tmp_path
    assert real_data.available_datasets() == []
    monkeypatch.delenv(real_data.ENV_VAR)
    repo = Path(__file__).resolve().parents[1]
    assert real_data.data_dir() == repo.parent / "shared" / "data"


def test_absent_dataset_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"a9a.*missing.*a9a\.t"):
        real_data.load("a9a", root=tmp_path)
    (tmp_path / "a9a").mkdir()
    (tmp_path / "a9a" / "a9a").write_text("1 1:1\n")
    assert "a9a" not in real_data.available_datasets(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"a9a\.t"):
        real_data.load("a9a", root=tmp_path)


def test_unknown_dataset_raises_value_error():
    with pytest.raises(ValueError, match="Unknown dataset 'nope'.*a9a"):
        real_data.load("nope")


# --------------------------------------------------------------------------
# parsers on tiny files
# --------------------------------------------------------------------------
def _write(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _reference_one_hot(train_rows, rows, min_count, offset):
    """Per-value dict encoding: frequent values sorted, then a rare id."""
    out = [[] for _ in rows]
    for j in range(len(train_rows[0])):
        counts = {}
        for r in train_rows:
            counts[r[j]] = counts.get(r[j], 0) + 1
        vocab = sorted(v for v, c in counts.items() if c >= min_count)
        ids = {v: offset + k for k, v in enumerate(vocab)}
        for i, r in enumerate(rows):
            out[i].append(ids.get(r[j], offset + len(vocab)))
        offset += len(vocab) + 1
    return out, offset


def _dense(rows_of_cols, n_features, values=None):
    D = np.zeros((len(rows_of_cols), n_features), dtype=np.float32)
    for i, cols in enumerate(rows_of_cols):
        for k, c in enumerate(cols):
            D[i, c] += 1.0 if values is None else values[i][k]
    return D


def test_avazu_parser(tmp_path):
    rng = np.random.default_rng(0)
    header = "id,click,hour," + ",".join(f"c{j}" for j in range(21))

    def row(i):
        cats = [f"{rng.integers(3):x}" for _ in range(22)]
        return [str(i), str(int(rng.integers(2)))] + cats

    train, dev, test = [row(i) for i in range(12)], [row(20)], [row(30), row(31)]
    test[1][5] = "unseen"
    _write(tmp_path, "avazu_9k/train.csv",
           header + "\n" + "\n".join(",".join(r) for r in train) + "\n")
    _write(tmp_path, "avazu_9k/dev.csv", ",".join(dev[0]) + "\n")
    _write(tmp_path, "avazu_9k/test.csv", "\n".join(",".join(r) for r in test) + "\n")
    ds = real_data.load("avazu_9k", root=tmp_path)
    check_contract(ds)
    fit_rows = [r[2:] for r in train + dev]
    splits = ((train + dev, ds.X_train, ds.y_train), (test, ds.X_test, ds.y_test))
    for rows, X, y in splits:
        codes, width = _reference_one_hot(fit_rows, [r[2:] for r in rows], 2, 0)
        assert X.shape == (len(rows), width)
        np.testing.assert_array_equal(X.toarray(), _dense(codes, width))
        np.testing.assert_array_equal(y, [int(r[1]) for r in rows])


def test_criteo_kaggle_parser(tmp_path):
    rng = np.random.default_rng(1)

    def row():
        nums = [str(int(v)) if rng.random() > 0.3 else ""
                for v in rng.integers(-2, 500, 13)]
        cats = [f"{v:08x}" if rng.random() > 0.2 else ""
                for v in rng.integers(4, size=26)]
        return [str(int(rng.integers(2)))] + nums + cats

    train, dev, test = ([row() for _ in range(n)] for n in (15, 2, 4))
    for rel, rows in (("train.csv", train), ("dev.csv", dev), ("test.csv", test)):
        text = "\n".join("\t".join(r) for r in rows) + "\n"
        _write(tmp_path, f"criteo_kaggle_8k/{rel}", text)
    ds = real_data.load("criteo_kaggle_8k", root=tmp_path, min_count=1)
    check_contract(ds)

    def transform(s):
        if s == "":
            return 0.0
        x = float(s)
        return math.copysign(math.log1p(abs(x)), x)

    fit = train + dev
    scale = [max(abs(transform(r[1 + j])) for r in fit) or 1.0 for j in range(13)]
    for rows, X, y in ((fit, ds.X_train, ds.y_train), (test, ds.X_test, ds.y_test)):
        codes, width = _reference_one_hot(
            [r[14:] for r in fit], [r[14:] for r in rows], 1, 13
        )
        cols = [list(range(13)) + c for c in codes]
        vals = [[transform(r[1 + j]) / scale[j] for j in range(13)] + [1.0] * 26
                for r in rows]
        assert X.shape == (len(rows), width)
        np.testing.assert_allclose(X.toarray(), _dense(cols, width, vals), rtol=1e-6)
        np.testing.assert_array_equal(y, [int(r[0]) for r in rows])


def test_libffm_parser(tmp_path):
    # unsorted fields, a repeated feature id (summed), a multi-valued field
    train = "1 2:7:0.5 0:3:1.0 1:9:0.25 1:3:2\n0 0:1:0.125\n"
    test = "0 5:12000:1.5 3:0:0.75\n"
    _write(tmp_path, "criteo_xlearn_ffm/small_train.txt", train)
    _write(tmp_path, "criteo_xlearn_ffm/small_test.txt", test)
    ds = real_data.load("criteo_xlearn_ffm", root=tmp_path)
    check_contract(ds)
    assert ds.n_features == 12001
    dense = ds.X_train.toarray()
    expected = np.zeros((2, 12001), dtype=np.float32)
    expected[0, [7, 3, 9]] = [0.5, 3.0, 0.25]
    expected[1, 1] = 0.125
    np.testing.assert_array_equal(dense, expected)
    np.testing.assert_array_equal(ds.y_train, [1, 0])
    assert ds.X_test[0, 12000] == 1.5 and ds.X_test[0, 0] == 0.75


def test_vw_parser(tmp_path):
    _write(tmp_path, "rcv1_vw_small/rcv1_small.dat",
           "-1 |f 1:0.5 7:0.25\n1 |f 3:1e-1\n")
    _write(tmp_path, "rcv1_vw_small/rcv1_small_test.data", "1 |f 2:2.0\n")
    ds = real_data.load("rcv1_vw_small", root=tmp_path)
    check_contract(ds)
    assert ds.n_features == 47236
    np.testing.assert_array_equal(ds.y_train, [0, 1])
    np.testing.assert_allclose(
        ds.X_train[:, :8].toarray(),
        [[0.5, 0, 0, 0, 0, 0, 0.25, 0], [0, 0, 0.1, 0, 0, 0, 0, 0]],
    )
    assert ds.X_test[0, 1] == 2.0


def test_movielens_parser(tmp_path):
    _write(tmp_path, "movielens_100k/u.info", "3 users\n4 items\n5 ratings\n")
    _write(tmp_path, "movielens_100k/u1.base", "1\t1\t5\t0\n3\t4\t2\t0\n2\t2\t4\t0\n")
    _write(tmp_path, "movielens_100k/u1.test", "2\t4\t3\t0\n")
    ds = real_data.load("movielens_100k", root=tmp_path)
    check_contract(ds)
    assert ds.task == "regression" and ds.n_features == 7
    np.testing.assert_array_equal(
        ds.X_train.toarray(),
        [[1, 0, 0, 1, 0, 0, 0], [0, 0, 1, 0, 0, 0, 1], [0, 1, 0, 0, 1, 0, 0]],
    )
    np.testing.assert_array_equal(ds.y_train, [5.0, 2.0, 4.0])
    np.testing.assert_array_equal(ds.X_test.toarray(), [[0, 1, 0, 0, 0, 0, 1]])


# --------------------------------------------------------------------------
# the real datasets
# --------------------------------------------------------------------------
# name: (train rows, test rows, n_features, nnz per row or None, positives in
# train, positives in test) -- from each SOURCE.md
FACTS = {
    "a9a": (32561, 16281, 123, None, 7841, 3846),
    "w8a": (None, None, 300, None, None, None),
    "agaricus": (6513, 1611, 126, 22, 3140, 776),
    "avazu_9k": (8087 + 480, 432, None, 22, 1397 + 86, 80),
    "criteo_kaggle_8k": (7200 + 409, 391, None, None, 1549 + 93, 86),
    "criteo_xlearn_ffm": (200, 200, 10000, None, 48, 46),
    "frappe": (57722, 28860, 5382, 10, 19063, 9536),
    "ipinyou_deepctr": (26773, 21150, 133465, 16, 255, 50),
    "movielens_100k": (80000, 20000, 943 + 1682, 2, None, None),
    "rcv1_vw_small": (1000, 500, 47236, None, 459, 245),
}

# a sane score for a default-ish scikit-learn model (AUC, or RMSE for
# MovieLens); the measured scores are well past these
SANE = {
    "a9a": 0.85, "w8a": 0.9, "agaricus": 0.99, "avazu_9k": 0.68,
    "criteo_kaggle_8k": 0.65, "criteo_xlearn_ffm": 0.52, "frappe": 0.88,
    "ipinyou_deepctr": 0.55, "rcv1_vw_small": 0.9, "movielens_100k": 1.0,
}


def test_every_dataset_is_known():
    assert set(FACTS) == set(real_data.DATASETS) == set(SANE)
    if DATA.is_dir():  # every directory of the shared data has a loader
        dirs = {p.name for p in DATA.iterdir() if p.is_dir()}
        assert dirs <= set(real_data.DATASETS), dirs - set(real_data.DATASETS)


@pytest.fixture(scope="module")
def loaded():
    cache = {}

    def get(name):
        if name not in AVAILABLE:
            pytest.skip(f"{name} not found under {DATA}")
        if name not in cache:
            cache[name] = real_data.load(name)
        return cache[name]

    return get


@pytest.mark.parametrize("name", real_data.DATASETS)
def test_real_dataset_contract_and_sizes(loaded, name):
    ds = loaded(name)
    assert ds.name == name
    check_contract(ds)
    n_train, n_test, n_features, per_row, pos_train, pos_test = FACTS[name]
    if n_train is not None:
        assert ds.X_train.shape[0] == n_train and ds.X_test.shape[0] == n_test
    if n_features is not None:
        assert ds.n_features == n_features
    if per_row is not None:
        for X in (ds.X_train, ds.X_test):
            np.testing.assert_array_equal(np.diff(X.indptr), per_row)
    if pos_train is not None:
        assert ds.y_train.sum() == pos_train and ds.y_test.sum() == pos_test


def test_w8a_split(loaded):
    ds = loaded("w8a")
    assert ds.X_train.shape[0] + ds.X_test.shape[0] == 49749
    assert ds.X_train.nnz + ds.X_test.nnz == 579586
    assert ds.y_train.sum() + ds.y_test.sum() == 1479
    assert abs(ds.y_train.mean() - ds.y_test.mean()) < 0.002  # stratified


def test_rcv1_rows_are_unit_norm(loaded):
    ds = loaded("rcv1_vw_small")
    assert ds.X_train.nnz == 77739 and ds.X_test.nnz == 39448
    norms = np.sqrt(ds.X_train.multiply(ds.X_train).sum(axis=1)).A1
    np.testing.assert_allclose(norms, 1.0, atol=1e-5)


def test_criteo_kaggle_has_one_entry_per_categorical_field(loaded):
    ds = loaded("criteo_kaggle_8k")
    for X in (ds.X_train, ds.X_test):
        cat = X[:, 13:]
        np.testing.assert_array_equal(np.diff(cat.indptr), 26)
        np.testing.assert_array_equal(cat.data, 1.0)
        assert np.abs(X[:, :13].toarray()).max() <= 1.5


def test_movielens_ratings(loaded):
    ds = loaded("movielens_100k")
    for X, y in ((ds.X_train, ds.y_train), (ds.X_test, ds.y_test)):
        assert set(np.unique(y)) == {1.0, 2.0, 3.0, 4.0, 5.0}
        # one user column (< 943) and one item column (>= 943) per row
        cols = X.indices.reshape(-1, 2)
        assert np.all(cols[:, 0] < 943) and np.all(cols[:, 1] >= 943)


@pytest.mark.parametrize("name", real_data.DATASETS)
def test_sklearn_model_gets_a_sane_score(loaded, name):
    ds = loaded(name)
    if ds.task == "regression":
        model = Ridge(alpha=3.0).fit(ds.X_train, ds.y_train)
        rmse = np.sqrt(mean_squared_error(ds.y_test, model.predict(ds.X_test)))
        baseline = np.sqrt(np.mean((ds.y_test - ds.y_train.mean()) ** 2))
        assert rmse < SANE[name] < baseline
    else:
        C = 0.1 if name == "ipinyou_deepctr" else 1.0  # 50 test positives
        model = LogisticRegression(C=C, max_iter=2000).fit(ds.X_train, ds.y_train)
        auc = roc_auc_score(ds.y_test, model.decision_function(ds.X_test))
        assert auc > SANE[name]
