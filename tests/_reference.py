"""A slow, obvious float64 numpy reference of one epoch of the mini-batch step.

It walks the layout's sample blocks one by one, builds each block as a dense
matrix in the *user's* feature order, and applies the update rules written
out literally.  The CPU backend (vectorised, over the tiles) and the CUDA
kernels are checked against it.
"""

import numpy as np

from sklearn_cuwide._layout import layout_to_csr


def _dense_blocks(layout):
    """Yield (batch, rows (user ids), dense block (m, n_features))."""
    X = layout_to_csr(layout).toarray().astype(np.float64)
    for bt in range(layout.n_batches):
        for g in range(layout.batch_sblock_ptr[bt], layout.batch_sblock_ptr[bt + 1]):
            lrows = np.arange(layout.sblock_row_ptr[g], layout.sblock_row_ptr[g + 1])
            users = layout.row_order[lrows]
            yield bt, users, X[users]


def reference_epoch(layout, y, sw, state, params, batch_order):
    """One epoch in float64; ``state`` arrays (user order) are updated in place.

    y, sw are in the user's row order.  Returns sum of sw * loss.
    """
    lr, eps = params.learning_rate, params.eps
    y = np.asarray(y, dtype=np.float64)
    sw = np.asarray(sw, dtype=np.float64)
    blocks = {}
    for bt, users, Xb in _dense_blocks(layout):
        blocks.setdefault(bt, []).append((users, Xb))
    W = state["w"]  # (d, D)
    V = state.get("V")
    b = state["b"]
    total = 0.0

    # penalty factor per (user) feature: n_batches / sample blocks holding it
    ps = np.ones(W.shape[0])
    if getattr(params, "penalty_scaled", False):
        held = np.zeros(W.shape[0])
        for users_xb in blocks.values():
            for _, Xb in users_xb:
                held += (Xb != 0).any(axis=0)
        ps = np.where(held > 0, layout.n_batches / np.maximum(held, 1), 0.0)

    def upd(P, G, idx, g, l1, l2):
        """Step t (sgd: lr; Adagrad: lr / (sqrt(G) + eps)), damped to the L2
        term's proximal form t / (1 + t l2); then the L1 soft threshold
        (l1, l2: scalars or columns, one value per row of idx)."""
        if params.solver == "sgd":
            step = lr
        else:
            G[idx] = G[idx] + g * g
            step = lr / (np.sqrt(G[idx]) + eps)
        step = step / (1.0 + step * l2)
        new = P[idx] - step * g
        if np.any(l1 > 0):
            new = np.sign(new) * np.maximum(np.abs(new) - step * l1, 0.0)
        P[idx] = new

    for bt in batch_order:
        wb = sum(sw[u].sum() for u, _ in blocks[bt])
        if wb <= 0:
            continue
        for users, Xb in blocks[bt]:
            present = np.flatnonzero((Xb != 0).any(axis=0))
            z = np.zeros((len(users), W.shape[1]))
            if params.fit_linear:
                z += Xb @ W
            if V is not None:
                S = Xb @ V
                z[:, 0] += 0.5 * ((S**2).sum(1) - ((Xb**2) @ (V**2)).sum(1))
            if params.fit_intercept:
                z += b
            yy, ss = y[users], sw[users]
            if params.loss == "logistic":
                lo = np.log1p(np.exp(-np.abs(z[:, 0]))) + np.maximum(z[:, 0], 0) - yy * z[:, 0]
                d = (1 / (1 + np.exp(-z[:, 0])) - yy)[:, None]
            elif params.loss == "squared":
                d = (z[:, 0] - yy)[:, None]
                lo = 0.5 * d[:, 0] ** 2
            else:
                zm = z - z.max(1, keepdims=True)
                p = np.exp(zm) / np.exp(zm).sum(1, keepdims=True)
                yi = yy.astype(int)
                lo = -np.log(p[np.arange(len(yi)), yi])
                d = p.copy()
                d[np.arange(len(yi)), yi] -= 1
            total += float(ss @ lo)
            e = d * (ss / wb)[:, None]
            p = ps[present][:, None]
            if params.fit_linear:
                gW = Xb.T @ e + params.l2_w * ps[:, None] * W
                upd(W, state.get("gw"), present, gW[present], params.l1 * p,
                    params.l2_w * p)
            if V is not None:
                # d z / d V[f, k] = x_f * (S_k - V[f, k] x_f)
                gV = Xb.T @ (e[:, 0:1] * S) - V * ((Xb**2).T @ e[:, 0])[:, None]
                gV += params.l2_v * ps[:, None] * V
                upd(V, state.get("gV"), present, gV[present], 0.0, params.l2_v * p)
            if params.fit_intercept:
                upd(b, state.get("gb"), slice(None), e.sum(0), 0.0, 0.0)
    return total
