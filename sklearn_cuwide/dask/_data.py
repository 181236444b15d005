"""The data of a distributed fit: the client, the input checks that need no
worker, and the partitions placed on the workers (one per worker).

Chunk ``k`` of ``n`` goes to worker ``floor(k * P / n)`` of the ``P``
workers used (``P`` = the cluster's workers, at most ``n``): contiguous runs
of chunks, about as many per worker, in the order of ``X``'s rows, so that
the partitions in rank order are the rows of ``X`` in order.  A worker
concatenates its chunks into one partition (:func:`._shard.make_shard`),
checked where it is; the client never holds the data.
"""

import numpy as np
import scipy.sparse as sp

from . import _shard

__all__ = ["get_client", "distribute", "on_workers"]


def get_client(client, estimator_name):
    """``client``, or the current ``dask.distributed`` client, or a clear error."""
    if client is not None:
        return client
    try:
        from distributed import default_client
    except ImportError as e:  # the package installed without its dask extra
        raise ImportError(
            f"{estimator_name} needs dask.distributed, which is not installed: "
            "pip install 'sklearn-cuwide[dask]'."
        ) from e

    try:
        return default_client()
    except ValueError:
        raise ValueError(
            f"{estimator_name} needs a dask.distributed Client: pass client=..., or "
            "start one first (e.g. `from distributed import Client, LocalCluster; "
            "client = Client(LocalCluster())`, or dask_cuda.LocalCUDACluster for "
            "one worker per GPU)."
        ) from None


def on_workers(client, fn, shards, workers, *args, **kwargs):
    """``fn(shard_k, *args, **kwargs)`` as one task on each partition's own
    worker (never moved: the partition stays where it is)."""
    return [
        client.submit(fn, s, *args, workers=[w], allow_other_workers=False, pure=False,
                      **kwargs)
        for s, w in zip(shards, workers)
    ]


def _rows(shard):
    return shard.X.shape[0]


def _is_dask_array(a):
    try:
        import dask.array as da
    except ImportError:  # pragma: no cover - dask is a dependency of distributed
        return False
    return isinstance(a, da.Array)


def _row_chunks(X):
    """The row chunk sizes of a dask ``X``, checked: 2-D, one chunk across
    the columns, known sizes."""
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D; got a {X.ndim}-D dask array.")
    rows, cols = X.chunks
    if len(cols) != 1:
        raise ValueError(
            f"X must be chunked by rows only (one chunk across its {X.shape[1]} "
            f"columns); it has {len(cols)} column chunks. Rechunk it with "
            "X.rechunk({1: -1})."
        )
    if any(not np.isfinite(c) for c in rows):
        raise ValueError(
            "X has chunks of unknown size; call X.compute_chunk_sizes() first."
        )
    return tuple(int(c) for c in rows)


def _aligned(a, name, rows, n):
    """``y`` or ``sample_weight`` as a list of per-chunk pieces (delayed
    objects for a dask array, numpy slices otherwise), checked against X's
    row chunks ``rows``; None stays None per chunk."""
    if a is None:
        return [None] * len(rows)
    if _is_dask_array(a):
        if a.ndim != 1:
            raise ValueError(f"{name} must be 1-D; got a {a.ndim}-D dask array.")
        if tuple(a.chunks[0]) != rows:
            raise ValueError(
                f"{name} is not chunked like X's rows: its chunks are "
                f"{tuple(a.chunks[0])}, X's are {rows}. Rechunk it with "
                f"{name}.rechunk(X.chunks[0])."
            )
        return list(a.to_delayed().ravel())
    a = np.asarray(a)
    if a.ndim != 1 or a.shape[0] != n:
        raise ValueError(
            f"{name} must be 1-D with one value per row of X ({n}); got shape {a.shape}."
        )
    bounds = np.concatenate([[0], np.cumsum(rows)])
    return [a[bounds[k]:bounds[k + 1]] for k in range(len(rows))]


def _check_sparse_meta(X):
    """Refuse a dask array whose chunks are dense numpy arrays, on the client
    before any task runs (else every chunk's task fails on its worker).  Its
    ``_meta``, the type dask records for the chunks, says so; an array made
    by ``da.from_delayed`` without ``meta`` records a numpy array too, and is
    told how to say that its chunks are sparse."""
    meta = getattr(X, "_meta", None)
    if type(meta) is np.ndarray:
        raise TypeError(
            "X must be a dask array of scipy.sparse CSR chunks; its chunks are "
            "dense numpy arrays. Convert them with "
            "X.map_blocks(scipy.sparse.csr_matrix), or use the single-process "
            "estimator for dense data. (An array of CSR chunks made with "
            "dask.array.from_delayed needs meta=scipy.sparse.csr_matrix((0, "
            f"{X.shape[1]})) to say its chunks are sparse.)"
        )


def distribute(client, X, y, sample_weight, *, device, y_numeric):
    """Place ``(X, y, sample_weight)`` on the workers, one partition each.

    ``X``: a dask array of scipy CSR chunks, row-chunked, or a scipy sparse
    matrix (split into one contiguous block of rows per worker).  ``y`` and
    ``sample_weight``: dask arrays chunked like ``X``'s rows, or arrays.

    Returns ``(shards, workers, n_features)``: the partitions' futures and
    their workers, in rank order.
    """
    # asked of the scheduler itself: scheduler_info() returns the client's
    # cached identity, which its periodic refresh (without the workers) can
    # replace between the fetch and the return
    all_workers = sorted(client.nthreads())
    if not all_workers:
        raise ValueError("The Dask cluster has no workers.")
    if _is_dask_array(X):
        _check_sparse_meta(X)
        rows = _row_chunks(X)
        n = int(sum(rows))
        xs = list(X.to_delayed().ravel())
        ys = _aligned(y, "y", rows, n)
        sws = _aligned(sample_weight, "sample_weight", rows, n)
        pieces = None
    elif sp.issparse(X):
        n = X.shape[0]
        if _is_dask_array(y):
            y = y.compute()
        if _is_dask_array(sample_weight):
            sample_weight = sample_weight.compute()
        P = max(1, min(len(all_workers), n))
        bounds = [k * n // P for k in range(P + 1)]
        rows = tuple(bounds[k + 1] - bounds[k] for k in range(P))
        Xc = X.tocsr()
        xs = [Xc[bounds[k]:bounds[k + 1]] for k in range(P)]
        ys = _aligned(y, "y", rows, n)
        sws = _aligned(sample_weight, "sample_weight", rows, n)
        pieces = True
    else:
        raise TypeError(
            "X must be a dask array of scipy.sparse CSR chunks (row-chunked) or a "
            f"scipy.sparse matrix; got {type(X).__name__}."
        )
    if n == 0:
        raise ValueError("X has 0 rows; at least 1 is required.")
    n_chunks = len(xs)
    P = min(len(all_workers), n_chunks)
    workers = all_workers[:P]
    owner = [workers[k * P // n_chunks] for k in range(n_chunks)]
    checked = []
    if pieces:
        for k in range(n_chunks):
            [fx, fy, fs] = client.scatter([xs[k], ys[k], sws[k]], workers=[owner[k]],
                                          direct=False)
            checked.append(client.submit(_shard.check_chunk, fx, fy, fs, index=k,
                                         y_numeric=y_numeric, workers=[owner[k]],
                                         allow_other_workers=False, pure=False))
    else:
        from dask import delayed

        for k in range(n_chunks):
            d = delayed(_shard.check_chunk, pure=False)(xs[k], ys[k], sws[k], index=k,
                                                        y_numeric=y_numeric)
            checked.append(client.compute(d, workers=[owner[k]],
                                          allow_other_workers=False))
    shards = []
    for w in workers:
        mine = [c for c, o in zip(checked, owner) if o == w]
        shards.append(client.submit(_shard.make_shard, device, *mine, workers=[w],
                                    allow_other_workers=False, pure=False))
    # the checks run now, so that bad input fails here, before any training
    # (a failed partition's error is raised by gathering its row count)
    client.gather([client.submit(_rows, s, workers=[w], pure=False)
                   for s, w in zip(shards, workers)])
    return shards, workers, int(X.shape[1])
