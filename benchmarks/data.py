"""The benchmark data: synthetic Criteo-like sets and the real datasets.

Synthetic data comes from the public generators
(:func:`sklearn_cuwide.datasets.make_ctr_classification` /
``make_ctr_regression``, ``model="fm"``).  A :class:`DataPool` generates each
(task, n_features) once, at the most rows any selected part asks for; smaller
sizes are row prefixes of it (views, no copy), and the test rows are the rows
after the largest prefix, the same for every size.

The real datasets are read from ``$SKLEARN_CUWIDE_DATA`` or
``<repo>/../shared/data`` (read-only, never copied); a dataset whose files are
absent is skipped.  Every loader returns a :class:`Dataset` whose train/test
splits hold CSR float32 ``X`` (sorted, duplicate-free indices, int32 index
arrays) with the same ``n_features``; binary labels are int64 0/1 (a ``-1``
label becomes 0), regression targets float64.

Datasets and how they are split and encoded:

``a9a``, ``agaricus``
    LIBSVM files, their own train and test files.
``w8a``
    LIBSVM; only the training file exists, so a stratified 75 / 25 split
    (``random_state=0``).
``frappe``
    libFM (0-based), the NFM authors' validation file as train and their test
    file as test (their train file is not available); 5,382 features.
``ipinyou_deepctr``
    libFM, 16 one-hot fields; ``n_features`` from ``featindex.fm.txt``.
``rcv1_vw_small``
    Vowpal Wabbit text (one namespace, TF-IDF values); 47,236 features (RCV1).
``criteo_xlearn_ffm``
    libffm ``field:feature:value``; the field is dropped and the (global)
    feature ids become columns; 10,000 features (the hash space).
``avazu_9k``, ``criteo_kaggle_8k``
    Raw Kaggle rows; ``train`` + ``dev`` files as train, ``test`` as test.
    Categorical columns are one-hot encoded with a vocabulary fit on train
    only: a value seen fewer than ``min_count`` times in train, or unseen,
    goes to its field's "rare" column, so every row has one entry per field.
    A missing Criteo categorical is the value "" (a category of its own).
    Criteo's 13 integer columns come first as values
    ``sign(x) * log1p(|x|)`` divided by the column's largest magnitude in
    train; missing or zero counts are not stored.
``movielens_100k``
    Fold ``u1.base`` / ``u1.test``: user one-hot then item one-hot
    (943 + 1,682 features, two nonzeros per row), target the 1-5 rating
    (``task="regression"``).
"""

import io
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from sklearn.datasets import load_svmlight_files
from sklearn.model_selection import train_test_split

__all__ = ["Data", "DataPool", "csr_rows", "csr_bytes", "Dataset", "DATASETS",
           "available_datasets", "data_dir", "load"]


# --------------------------------------------------------------------------
# what every benchmark part gets
# --------------------------------------------------------------------------
@dataclass
class Data:
    """A train/test split as the systems see it."""

    key: str
    task: str  # "binary" or "regression"
    X: object
    y: np.ndarray
    Xt: object
    yt: np.ndarray
    source: str = "synthetic"
    base: str = None  # the generated matrix this is a row prefix of

    @property
    def n(self):
        return int(self.X.shape[0])

    @property
    def d(self):
        return int(self.X.shape[1])

    def rows(self, n):
        """The first ``n`` training rows (a view), the same test rows."""
        n = min(int(n), self.n)
        return Data(self.key, self.task, csr_rows(self.X, 0, n), self.y[:n], self.Xt,
                    self.yt, self.source, self.base)


def csr_bytes(X):
    return int(X.data.nbytes + X.indices.nbytes + X.indptr.nbytes)


def csr_rows(X, a, b):
    """Rows ``a:b`` of a CSR matrix as views of its arrays (no copy)."""
    ip = X.indptr
    s, e = int(ip[a]), int(ip[b])
    indptr = ip[a : b + 1] - ip[a] if a else ip[: b + 1]
    return sp.csr_matrix((X.data[s:e], X.indices[s:e], indptr), shape=(b - a, X.shape[1]),
                         copy=False)


class DataPool:
    """Synthetic datasets: :meth:`plan` every size first, then :meth:`get`."""

    def __init__(self, test_rows, seed=0, log=print):
        self.test_rows = int(test_rows)
        self.seed = seed
        self.log = log
        self.need = {}  # (task, log2 features) -> (train rows, with test rows)
        self.full = {}  # (task, log2 features) -> (X, y, train rows, with test rows)
        self.generated = {}  # what was generated -> seconds

    def plan(self, task, log2_features, rows, test=True):
        k = (task, int(log2_features))
        r, t = self.need.get(k, (0, False))
        self.need[k] = (max(r, int(rows)), t or test)

    def get(self, task, log2_features, rows, test=True):
        from sklearn_cuwide.datasets import make_ctr_classification, make_ctr_regression

        k = (task, int(log2_features))
        have = self.full.get(k)
        if have is None or have[2] < rows or (test and not have[3]):
            self.plan(task, log2_features, rows, test)
            n_train, with_test = self.need[k]
            n = n_train + (self.test_rows if with_test else 0)
            gen = make_ctr_classification if task == "binary" else make_ctr_regression
            t0 = time.perf_counter()
            X, y = gen(n_samples=n, n_features=2 ** int(log2_features), model="fm",
                       random_state=self.seed)
            dt = time.perf_counter() - t0
            self.full[k] = have = (X, y, n_train, with_test)
            self.generated[f"{task} {n}x2^{log2_features}"] = dt
            self.log(f"  data: {gen.__name__}({n:,} x 2^{log2_features}, model='fm') {dt:.1f} s")
        X, y, n_train, with_test = have
        t = n_train if with_test else X.shape[0]
        name = "ctr" if task == "binary" else "ctr-regression"
        return Data(f"{name} {rows}x2^{log2_features}", task, csr_rows(X, 0, rows), y[:rows],
                    csr_rows(X, t, X.shape[0]), y[t:],
                    base=f"{task} {n_train}+{X.shape[0] - n_train}x2^{log2_features}")


# --------------------------------------------------------------------------
# the real datasets
# --------------------------------------------------------------------------
ENV_VAR = "SKLEARN_CUWIDE_DATA"


@dataclass(frozen=True, eq=False)
class Dataset:
    """A train/test split of one dataset."""

    name: str
    task: str
    X_train: sp.csr_matrix
    y_train: np.ndarray
    X_test: sp.csr_matrix
    y_test: np.ndarray

    @property
    def n_features(self):
        return self.X_train.shape[1]

    def __repr__(self):
        return (
            f"Dataset(name={self.name!r}, task={self.task!r}, "
            f"train={self.X_train.shape[0]}, test={self.X_test.shape[0]}, "
            f"n_features={self.n_features}, nnz_train={self.X_train.nnz})"
        )


def data_dir():
    """The data root: ``$SKLEARN_CUWIDE_DATA`` or ``<repo>/../shared/data``."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "shared" / "data"


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------
def _csr(X, n_features=None):
    """CSR float32, duplicates summed, indices sorted, int32 index arrays."""
    X = sp.csr_matrix(X, dtype=np.float32)
    if n_features is not None and X.shape[1] != n_features:
        X = sp.csr_matrix((X.data, X.indices, X.indptr), shape=(X.shape[0], n_features))
    X.sum_duplicates()  # also sorts the indices
    X.eliminate_zeros()
    X.indices = X.indices.astype(np.int32, copy=False)
    X.indptr = X.indptr.astype(np.int32, copy=False)
    return X


def _binary(y):
    """{-1, 1} or {0, 1} labels as int64 0/1."""
    return (np.asarray(y) > 0).astype(np.int64)


def _svmlight(paths, zero_based, n_features=None, texts=None):
    """Load LIBSVM files (or already-converted bytes) with a common width."""
    if texts is not None:
        sources = [io.BytesIO(t) for t in texts]
    else:
        sources = [str(p) for p in paths]
    out = load_svmlight_files(
        sources, n_features=n_features, dtype=np.float32, zero_based=zero_based
    )
    Xs, ys = out[0::2], out[1::2]
    width = max(X.shape[1] for X in Xs) if n_features is None else n_features
    return [_csr(X, width) for X in Xs], list(ys)


def _binary_dataset(name, Xs, ys):
    return Dataset(name, "binary", Xs[0], _binary(ys[0]), Xs[1], _binary(ys[1]))


def _read_rows(path, sep, skip_header=False):
    """A text table as a 2-D array of str (no quoting in these files)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if skip_header:
        lines = lines[1:]
    rows = [line.split(sep) for line in lines if line]
    widths = {len(r) for r in rows}
    if len(widths) != 1:
        raise ValueError(
            f"{path}: rows have different numbers of fields {sorted(widths)}"
        )
    return np.array(rows, dtype=str)


def _one_hot(train_cols, test_cols, min_count, offset):
    """One-hot codes of categorical columns, vocabulary from ``train`` only.

    Column ``j`` owns a contiguous block of ids: its frequent values (seen at
    least ``min_count`` times in train) in sorted order, then one "rare"
    id for everything else.  Returns int arrays of shape (n, n_cols) for
    train and test, and the total width.
    """
    codes_train = np.empty(train_cols.shape, dtype=np.int64)
    codes_test = np.empty(test_cols.shape, dtype=np.int64)
    for j in range(train_cols.shape[1]):
        values, counts = np.unique(train_cols[:, j], return_counts=True)
        vocab = values[counts >= min_count]
        rare = len(vocab)
        for cols, codes in ((train_cols, codes_train), (test_cols, codes_test)):
            pos = np.searchsorted(vocab, cols[:, j])
            if rare:
                hit = (pos < rare) & (vocab[np.minimum(pos, rare - 1)] == cols[:, j])
            else:
                hit = np.zeros(len(pos), dtype=bool)
            codes[:, j] = offset + np.where(hit, pos, rare)
        offset += rare + 1
    return codes_train, codes_test, offset


def _rows_to_csr(indices, values=None, n_features=None):
    """CSR from an (n, k) array of column ids per row (and optional values)."""
    n, k = indices.shape
    if values is None:
        values = np.ones((n, k), dtype=np.float32)
    indptr = np.arange(0, n * k + 1, k, dtype=np.int64)
    X = sp.csr_matrix(
        (values.reshape(-1), indices.reshape(-1), indptr), shape=(n, n_features)
    )
    return _csr(X)


# --------------------------------------------------------------------------
# loaders
# --------------------------------------------------------------------------
def load_a9a(root):
    Xs, ys = _svmlight([root / "a9a" / "a9a", root / "a9a" / "a9a.t"], False, 123)
    return _binary_dataset("a9a", Xs, ys)


def load_w8a(root):
    (X,), (y,) = _svmlight([root / "w8a" / "w8a"], False, 300)
    y = _binary(y)
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=0.25, stratify=y, random_state=0
    )
    return Dataset("w8a", "binary", _csr(X_train), y_train, _csr(X_test), y_test)


def load_agaricus(root):
    d = root / "agaricus"
    Xs, ys = _svmlight([d / "agaricus_train.txt", d / "agaricus_test.txt"], False, 126)
    return _binary_dataset("agaricus", Xs, ys)


def load_frappe(root):
    d = root / "frappe"
    Xs, ys = _svmlight(
        [d / "frappe.validation.libfm", d / "frappe.test.libfm"], True, 5382
    )
    return _binary_dataset("frappe", Xs, ys)


def load_ipinyou_deepctr(root):
    d = root / "ipinyou_deepctr"
    with open(d / "featindex.fm.txt", encoding="utf-8") as f:
        ids = [int(line.rsplit("\t", 1)[1]) for line in f if line.strip()]
    Xs, ys = _svmlight([d / "train.fm.txt", d / "test.fm.txt"], True, max(ids) + 1)
    return _binary_dataset("ipinyou_deepctr", Xs, ys)


def load_rcv1_vw_small(root):
    d = root / "rcv1_vw_small"
    texts = []
    for p in (d / "rcv1_small.dat", d / "rcv1_small_test.data"):
        # "label |f idx:val ..." -> "label idx:val ..."
        texts.append(re.sub(rb"\|\S*", b"", p.read_bytes()))
    Xs, ys = _svmlight(None, False, texts=texts)
    width = max(47236, Xs[0].shape[1])
    return _binary_dataset("rcv1_vw_small", [_csr(X, width) for X in Xs], ys)


def _read_libffm(path):
    """libffm ``label field:feature:value ...`` as (labels, CSR, fields).

    Tokens need not be sorted (sklearn's svmlight reader requires it), so
    the file is parsed here: one split of the whole text, then numpy.
    """
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    labels = np.array([float(r[0]) for r in rows])
    lengths = np.array([len(r) - 1 for r in rows], dtype=np.int64)
    triples = " ".join(" ".join(r[1:]) for r in rows).replace(":", " ").split()
    triples = np.array(triples, dtype=np.float64).reshape(-1, 3)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    feature = triples[:, 1].astype(np.int64)
    X = sp.csr_matrix(
        (triples[:, 2], feature, indptr), shape=(len(rows), int(feature.max()) + 1)
    )
    return labels, X, triples[:, 0].astype(np.int64)


def load_criteo_xlearn_ffm(root):
    d = root / "criteo_xlearn_ffm"
    parts = [_read_libffm(d / f) for f in ("small_train.txt", "small_test.txt")]
    width = max([10000] + [X.shape[1] for _, X, _ in parts])
    Xs = [_csr(X, width) for _, X, _ in parts]
    return _binary_dataset("criteo_xlearn_ffm", Xs, [y for y, _, _ in parts])


def load_avazu_9k(root, min_count=2):
    d = root / "avazu_9k"
    train = np.concatenate(
        [
            _read_rows(d / "train.csv", ",", skip_header=True),
            _read_rows(d / "dev.csv", ","),
        ]
    )
    test = _read_rows(d / "test.csv", ",")
    # columns: id, click, hour, C1, banner_pos, ... (22 categoricals)
    codes_train, codes_test, width = _one_hot(train[:, 2:], test[:, 2:], min_count, 0)
    return Dataset(
        "avazu_9k",
        "binary",
        _rows_to_csr(codes_train, n_features=width),
        train[:, 1].astype(np.int64),
        _rows_to_csr(codes_test, n_features=width),
        test[:, 1].astype(np.int64),
    )


def _criteo_numeric(cols, scale=None):
    """Counts as ``sign(x) * log1p(|x|) / scale`` (missing -> 0)."""
    x = np.where(cols == "", "nan", cols).astype(np.float64)
    v = np.sign(x) * np.log1p(np.abs(x))
    v = np.nan_to_num(v, nan=0.0)
    if scale is None:
        scale = np.abs(v).max(axis=0)
        scale[scale == 0] = 1.0
    return v / scale, scale


def load_criteo_kaggle_8k(root, min_count=2):
    d = root / "criteo_kaggle_8k"
    train = np.concatenate(
        [_read_rows(d / "train.csv", "\t"), _read_rows(d / "dev.csv", "\t")]
    )
    test = _read_rows(d / "test.csv", "\t")
    if train.shape[1] != 40:
        raise ValueError(
            f"{d}: expected 40 tab-separated columns, got {train.shape[1]}"
        )
    n_num = 13
    num_train, scale = _criteo_numeric(train[:, 1 : 1 + n_num])
    num_test, _ = _criteo_numeric(test[:, 1 : 1 + n_num], scale)
    codes_train, codes_test, width = _one_hot(
        train[:, 1 + n_num :], test[:, 1 + n_num :], min_count, n_num
    )

    def build(num, codes):
        n = num.shape[0]
        idx = np.hstack([np.broadcast_to(np.arange(n_num), (n, n_num)), codes])
        val = np.hstack([num, np.ones(codes.shape)]).astype(np.float32)
        return _rows_to_csr(idx, val, width)  # zeros (missing counts) dropped

    return Dataset(
        "criteo_kaggle_8k",
        "binary",
        build(num_train, codes_train),
        train[:, 0].astype(np.int64),
        build(num_test, codes_test),
        test[:, 0].astype(np.int64),
    )


def load_movielens_100k(root):
    d = root / "movielens_100k"
    n_users = n_items = None
    info = d / "u.info"
    if info.exists():
        counts = dict(
            (parts[1], int(parts[0]))
            for parts in (line.split() for line in info.read_text().splitlines())
            if len(parts) == 2
        )
        n_users, n_items = counts.get("users"), counts.get("items")
    train = np.loadtxt(d / "u1.base", dtype=np.int64, delimiter="\t", ndmin=2)
    test = np.loadtxt(d / "u1.test", dtype=np.int64, delimiter="\t", ndmin=2)
    if n_users is None or n_items is None:
        both = np.vstack([train, test])
        n_users, n_items = int(both[:, 0].max()), int(both[:, 1].max())

    def build(r):
        idx = np.column_stack([r[:, 0] - 1, n_users + r[:, 1] - 1])
        return _rows_to_csr(idx, n_features=n_users + n_items)

    return Dataset(
        "movielens_100k",
        "regression",
        build(train),
        train[:, 2].astype(np.float64),
        build(test),
        test[:, 2].astype(np.float64),
    )


# name -> (loader, the files it reads, relative to the data root)
_REGISTRY = {
    name: (loader, [f"{name}/{f}" for f in files])
    for name, loader, files in [
        ("a9a", load_a9a, ["a9a", "a9a.t"]),
        ("w8a", load_w8a, ["w8a"]),
        ("agaricus", load_agaricus, ["agaricus_train.txt", "agaricus_test.txt"]),
        ("avazu_9k", load_avazu_9k, ["train.csv", "dev.csv", "test.csv"]),
        (
            "criteo_kaggle_8k",
            load_criteo_kaggle_8k,
            ["train.csv", "dev.csv", "test.csv"],
        ),
        (
            "criteo_xlearn_ffm",
            load_criteo_xlearn_ffm,
            ["small_train.txt", "small_test.txt"],
        ),
        ("frappe", load_frappe, ["frappe.validation.libfm", "frappe.test.libfm"]),
        (
            "ipinyou_deepctr",
            load_ipinyou_deepctr,
            ["train.fm.txt", "test.fm.txt", "featindex.fm.txt"],
        ),
        ("movielens_100k", load_movielens_100k, ["u1.base", "u1.test"]),
        (
            "rcv1_vw_small",
            load_rcv1_vw_small,
            ["rcv1_small.dat", "rcv1_small_test.data"],
        ),
    ]
}

#: Every dataset this module knows, whether or not its files are present.
DATASETS = tuple(_REGISTRY)


def _root(root):
    return data_dir() if root is None else Path(root)


def available_datasets(root=None):
    """Names of the known datasets whose files are all present under ``root``."""
    root = _root(root)
    return [
        name for name, (_, files) in _REGISTRY.items()
        if all((root / f).is_file() for f in files)
    ]


def load(name, root=None, **kwargs):
    """Load dataset ``name`` from ``root`` (default: :func:`data_dir`).

    Raises
    ------
    ValueError
        If ``name`` is not a known dataset.
    FileNotFoundError
        If its files are not under ``root``.
    """
    if name not in _REGISTRY:
        raise ValueError(
            f"Unknown dataset {name!r}; known datasets: {', '.join(DATASETS)}."
        )
    root = _root(root)
    loader, files = _REGISTRY[name]
    missing = [str(root / f) for f in files if not (root / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"Dataset {name!r} is not available: missing {', '.join(missing)}. "
            f"Put the shared data at {data_dir()} or set {ENV_VAR} to its directory."
        )
    return loader(root, **kwargs)
