"""A slow, obvious numpy statement of the layout build's fused kernels
(:class:`sklearn_cuwide._layout.BuildKernels`; the CUDA backend's are
``cuda/cuwide_build.cu``): a Python loop per row, per run and per tile, in
the words of the protocol's docstrings.

Handed to the layout build with numpy (or the stand-in for cupy), it checks
on the CPU that the build calls the kernels as the array operations they
replace would run (same layout, bit for bit); the GPU tests check the CUDA
kernels against the same builds.
"""

import numpy as np

from sklearn_cuwide._layout import BuildKernels, permutation_keys


class ReferenceBuildKernels(BuildKernels):
    """The kernels in numpy; ``wrap`` gives results the caller's array type
    (the stand-in's device arrays)."""

    def __init__(self, wrap=lambda a: a):
        self.wrap = wrap
        self.calls = []

    def takes(self, indices, data):
        return (indices.dtype in (np.int32, np.int64)
                and data.dtype in (np.float32, np.float64))

    @staticmethod
    def _rows(indptr, users, n_rows):
        return range(n_rows) if users is None else (int(u) for u in users)

    def feature_counts(self, indptr, indices, data, n_features, left_out):
        self.calls.append("feature_counts")
        counts = np.zeros(int(n_features), dtype=np.int64)
        for rows, delta in ((None, 1), (left_out, -1)):
            if delta < 0 and rows is None:
                continue
            n = int(indptr.shape[0]) - 1 if rows is None else int(rows.shape[0])
            for s in self._rows(indptr, rows, n):
                for p in range(int(indptr[s]), int(indptr[s + 1])):
                    if data[p] != 0:
                        counts[int(indices[p])] += delta
        return self.wrap(counts)

    def rank(self, counts, top, hot_min):
        self.calls.append("rank")
        c = np.asarray(counts, dtype=np.int64)
        n = c.shape[0]
        keys = np.sort((int(top) - c) * n + np.arange(n, dtype=np.int64))
        order = keys % n
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n, dtype=np.int64)
        n_hot = sum(1 for v in c if float(v) >= hot_min)
        return counts, self.wrap(order), self.wrap(rank), n_hot

    def row_order(self, n_rows, random_state):
        self.calls.append("row_order")
        keys, mask, shift = permutation_keys(int(n_rows), random_state)
        out = []
        for i in range(int(n_rows)):  # each position through the rounds until in range
            x = i
            while True:
                for k, m in keys:
                    x = ((x ^ int(k)) * int(m)) & int(mask)
                    x ^= x >> int(shift)
                if x < n_rows:
                    break
            out.append(x)
        return self.wrap(np.asarray(out, dtype=np.int64))

    def batch_nnz(self, indptr, users, n_rows, batch_size):
        self.calls.append("batch_nnz")
        rows = list(self._rows(indptr, users, int(n_rows)))
        out = []
        for b0 in range(0, len(rows), int(batch_size)):
            out.append(sum(int(indptr[s + 1] - indptr[s])
                           for s in rows[b0 : b0 + int(batch_size)]))
        return np.asarray(out, dtype=np.int64)

    def chunk_keys(self, tiler, k, indptr, indices, data, users):
        self.calls.append("chunk_keys")
        p = tiler.plan
        r0, r1 = p.chunk_rows(k)
        rank, bsp = np.asarray(tiler._rank), np.asarray(tiler._bsp)
        keys, vals = [], []
        n = r1 - r0 if users is None else int(users.shape[0])
        for i, s in enumerate(self._rows(indptr, users, n)):
            lrow = r0 + i
            bt, pos = divmod(lrow, p.batch_size)
            g = int(bsp[bt]) + pos // p.sample_block
            local = pos % p.sample_block
            for q in range(int(indptr[s]), int(indptr[s + 1])):
                nf = int(rank[int(indices[q])])
                keys.append((g * p.n_features + nf) * p.sample_block + local)
                vals.append(data[q])
        return (self.wrap(np.asarray(keys, dtype=np.int64)),
                self.wrap(np.asarray(vals, dtype=data.dtype).astype(tiler.dtype)))

    def chunk_store(self, tiler, key, val, perm, start, g0, g1):
        self.calls.append("chunk_store")
        p = tiler.plan
        sk, sv = np.asarray(key)[np.asarray(perm)], np.asarray(val)[np.asarray(perm)]
        tiles = np.zeros(2 * (g1 - g0), dtype=np.int64)
        out = []
        i = 0
        while i < sk.shape[0]:
            j, s = i, 0.0
            while j < sk.shape[0] and sk[j] == sk[i]:
                s += float(sv[j])  # float64, in the sorted order
                j += 1
            if s != 0.0:
                t, local = divmod(int(sk[i]), p.sample_block)
                g, f = divmod(t, p.n_features)
                out.append((f, local, s))
                tiles[2 * (g - g0) + (1 if f >= p.n_hot else 0)] += 1
            i = j
        m = len(out)
        if m:
            f, r, v = zip(*out)
            a = int(start)
            for dst, src in ((tiler.feat, np.asarray(f, dtype=np.int32)),
                             (tiler.row, np.asarray(r, dtype=np.uint16)),
                             (tiler.val, np.asarray(v, dtype=np.float64).astype(tiler.dtype))):
                dst[a : a + m] = src
        return m, tiles

    def penalty_scale(self, feat, tile_ptr, n_features, n_batches):
        self.calls.append("penalty_scale")
        feat, tile_ptr = np.asarray(feat), np.asarray(tile_ptr)
        held = np.zeros(int(n_features), dtype=np.int64)
        for t in range(tile_ptr.shape[0] - 1):
            a, b = int(tile_ptr[t]), int(tile_ptr[t + 1])
            for f in set(int(x) for x in feat[a:b]):
                held[f] += 1
        out = np.zeros(int(n_features), dtype=np.float32)
        for j in range(int(n_features)):
            if held[j] > 0:
                out[j] = np.float32(float(n_batches) / float(held[j]))
        return self.wrap(out)
