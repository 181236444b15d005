"""The anchors every GPU benchmark is measured against, in the same run.

* ``copy_bandwidth`` / ``h2d_bandwidth``: the device's measured ceilings
  (the memory-bandwidth floor of an epoch is one read of the CSR bytes);
* ``TorchWide``: a PyTorch ``nn.EmbeddingBag`` LR / ``nn.Embedding`` FM with
  sparse gradients and ``torch.optim.Adagrad`` (the hand-written model users
  have today);
* ``cusparse_epoch``: a CuPy cuSPARSE mini-batch baseline
  (``X_b @ w``, ``X_b.T @ g``, dense Adagrad update);
* scikit-learn on the CPU is called directly by the scripts.

Nothing here is imported by the package.
"""


import numpy as np


# --------------------------------------------------------------------------
# ceilings
# --------------------------------------------------------------------------
def time_events(fn):
    """Milliseconds of device time ``fn()`` takes (CUDA events on the current stream)."""
    import cupy as cp

    a, b = cp.cuda.Event(), cp.cuda.Event()
    a.record()
    fn()
    b.record()
    b.synchronize()
    return cp.cuda.get_elapsed_time(a, b)


def _median_event_ms(fn, repeat=10, warmup=2):
    for _ in range(warmup):
        fn()
    return float(np.median([time_events(fn) for _ in range(repeat)]))


def copy_bandwidth(nbytes=2 << 30):
    """Device-to-device copy rate, bytes read + written per second."""
    import cupy as cp

    src = cp.ones(nbytes // 4, dtype=cp.float32)
    dst = cp.empty_like(src)
    ms = _median_event_ms(lambda: dst.__setitem__(Ellipsis, src), repeat=12)
    del src, dst
    return 2 * nbytes / (ms * 1e-3)


def h2d_bandwidth(nbytes=1 << 30):
    """Pinned host -> device copy rate, bytes per second."""
    import cupy as cp

    mem = cp.cuda.alloc_pinned_memory(nbytes)
    host = np.frombuffer(mem, dtype=np.uint8, count=nbytes)
    host[:] = 1
    dev = cp.empty(nbytes, dtype=cp.uint8)
    ms = _median_event_ms(lambda: dev.set(host), repeat=5)
    return nbytes / (ms * 1e-3)


def csr_bytes(X):
    return int(X.data.nbytes + X.indices.nbytes + X.indptr.nbytes)


# --------------------------------------------------------------------------
# PyTorch EmbeddingBag models
# --------------------------------------------------------------------------
class TorchWide:
    """LR (EmbeddingBag, sum, per-sample weights) or FM (Embedding per field).

    The FM path needs the same number of nonzeros in every row (Criteo-like
    data: one id per field), as the usual PyTorch FM implementations do.
    """

    def __init__(self, X, n_factors=0, lr=0.05, init_scale=0.01, seed=0):
        import torch

        self.torch = torch
        self.dev = torch.device("cuda")
        torch.manual_seed(seed)
        d = X.shape[1]
        self.k = n_factors
        self.nnz_row = None
        if n_factors:
            lens = np.diff(X.indptr)
            if lens.min() != lens.max():
                raise ValueError("the PyTorch FM baseline needs fixed-length rows")
            self.nnz_row = int(lens[0])
            self.V = torch.nn.Embedding(d, n_factors, sparse=True).to(self.dev)
            torch.nn.init.normal_(self.V.weight, std=init_scale)
            self.lin = torch.nn.Embedding(d, 1, sparse=True).to(self.dev)
            torch.nn.init.zeros_(self.lin.weight)
            params = [self.V.weight, self.lin.weight]
        else:
            self.emb = torch.nn.EmbeddingBag(d, 1, mode="sum", sparse=True).to(self.dev)
            torch.nn.init.zeros_(self.emb.weight)
            params = [self.emb.weight]
        self.bias = torch.zeros(1, device=self.dev, requires_grad=True)
        self.opt_sparse = torch.optim.Adagrad(params, lr=lr)
        self.opt_dense = torch.optim.Adagrad([self.bias], lr=lr)
        self.loss = torch.nn.BCEWithLogitsLoss()

    def put(self, X, y=None):
        t = self.torch
        out = (
            t.as_tensor(X.indptr.astype(np.int64), device=self.dev),
            t.as_tensor(X.indices.astype(np.int64), device=self.dev),
            t.as_tensor(X.data.astype(np.float32), device=self.dev),
        )
        if y is not None:
            out = out + (t.as_tensor(np.asarray(y, dtype=np.float32), device=self.dev),)
        return out

    def _forward(self, indptr, indices, data, a, b):
        s, e = indptr[a], indptr[b]
        idx, x = indices[s:e], data[s:e]
        if self.k:
            n = b - a
            idx = idx.view(n, self.nnz_row)
            x = x.view(n, self.nnz_row)
            emb = self.V(idx) * x.unsqueeze(-1)
            ssum = emb.sum(1)
            q = (emb * emb).sum(1)
            lin = (self.lin(idx).squeeze(-1) * x).sum(1)
            return self.bias + lin + 0.5 * (ssum * ssum - q).sum(1)
        offsets = indptr[a:b] - s
        return self.emb(idx, offsets, per_sample_weights=x).squeeze(1) + self.bias

    def epoch(self, data, batch_size, order):
        indptr, indices, vals, y = data
        n = indptr.numel() - 1
        for bi in order:
            a = int(bi) * batch_size
            b = min(n, a + batch_size)
            z = self._forward(indptr, indices, vals, a, b)
            loss = self.loss(z, y[a:b])
            self.opt_sparse.zero_grad()
            self.opt_dense.zero_grad()
            loss.backward()
            self.opt_sparse.step()
            self.opt_dense.step()

    def timed_epoch(self, data, batch_size, order):
        """One epoch; returns its wall-clock milliseconds (device synchronised)."""
        import time

        self.torch.cuda.synchronize()
        t0 = time.perf_counter()
        self.epoch(data, batch_size, order)
        self.torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3

    def decision(self, data, batch_size=1 << 16):
        indptr, indices, vals = data[:3]
        n = indptr.numel() - 1
        outs = []
        with self.torch.no_grad():
            for a in range(0, n, batch_size):
                outs.append(self._forward(indptr, indices, vals, a, min(n, a + batch_size)))
        return self.torch.cat(outs).float().cpu().numpy()


# --------------------------------------------------------------------------
# CuPy cuSPARSE mini-batch baseline
# --------------------------------------------------------------------------
class CusparseWide:
    """Mini-batch Adagrad with cuSPARSE products and dense model updates."""

    def __init__(self, X, y, batch_size, n_factors=0, lr=0.05, init_scale=0.01, seed=0):
        import cupy as cp
        import cupyx.scipy.sparse as cpsp

        self.cp = cp
        d = X.shape[1]
        self.k = n_factors
        n = X.shape[0]
        self.batches = []
        for a in range(0, n, batch_size):
            Xb = cpsp.csr_matrix(X[a : a + batch_size])
            Xb2 = Xb.multiply(Xb).tocsr() if n_factors else None
            self.batches.append((Xb, Xb2, cp.asarray(y[a : a + batch_size], dtype=cp.float32)))
        self.w = cp.zeros(d, dtype=cp.float32)
        self.Gw = cp.zeros(d, dtype=cp.float32)
        self.b = cp.zeros(1, dtype=cp.float32)
        self.Gb = cp.zeros(1, dtype=cp.float32)
        if n_factors:
            rs = cp.random.RandomState(seed)
            self.V = (rs.standard_normal((d, n_factors)) * init_scale).astype(cp.float32)
            self.GV = cp.zeros_like(self.V)
        self.lr = lr

    def _ada(self, p, G, g):
        G += g * g
        p -= self.lr * g / (self.cp.sqrt(G) + 1e-7)

    def step(self, i):
        cp = self.cp
        Xb, Xb2, yb = self.batches[i]
        z = Xb @ self.w + self.b
        if self.k:
            S = Xb @ self.V
            Q = Xb2 @ (self.V * self.V)
            z = z + 0.5 * (S * S - Q).sum(1)
        e = (1 / (1 + cp.exp(-z)) - yb) / yb.size
        self._ada(self.w, self.Gw, Xb.T @ e)
        self._ada(self.b, self.Gb, e.sum(keepdims=True))
        if self.k:
            gV = Xb.T @ (e[:, None] * S) - self.V * (Xb2.T @ e)[:, None]
            self._ada(self.V, self.GV, gV)

    def epoch(self, order):
        for i in order:
            self.step(int(i))
