"""The pointwise losses, written once for every backend and solver.

The CPU backend's mini-batch step, the L-BFGS objective on either backend and
the validation loss of early stopping all call :func:`pointwise_loss`; the
CUDA kernels implement the same formulas (``cuda/cuwide_common.cuh``) and are
tested against it through the CPU backend.
"""

__all__ = ["LOSSES", "pointwise_loss", "weighted_loss"]

#: the losses: binary log-loss on 0/1 targets, softmax cross-entropy on class
#: indices, half the squared error on real targets
LOSSES = ("logistic", "multinomial", "squared")


def pointwise_loss(xp, Z, y, loss):
    """Per-sample loss and its derivative with respect to the decision values.

    Parameters
    ----------
    xp : module
        numpy or cupy: the array module of ``Z`` and ``y``.
    Z : array of shape (n, n_outputs), float64
        Decision values.
    y : array of shape (n,)
        0/1 targets (``"logistic"``), class indices (``"multinomial"``) or
        real targets (``"squared"``).
    loss : {"logistic", "multinomial", "squared"}

    Returns
    -------
    loss : array of shape (n,)
    derivative : array of shape (n, n_outputs)
    """
    if loss == "logistic":
        z = Z[:, 0]
        lo = xp.logaddexp(0.0, z) - y * z
        p = 0.5 * (1.0 + xp.tanh(0.5 * z))  # the sigmoid, without overflow
        return lo, (p - y)[:, None]
    if loss == "squared":
        d = Z[:, 0] - y
        return 0.5 * d * d, d[:, None]
    if loss != "multinomial":
        raise ValueError(f"unknown loss {loss!r}; expected one of {LOSSES}")
    zmax = Z.max(axis=1, keepdims=True)
    ez = xp.exp(Z - zmax)
    se = ez.sum(axis=1, keepdims=True)
    lse = (xp.log(se) + zmax)[:, 0]
    yi = y.astype(xp.int64)
    rows = xp.arange(Z.shape[0])
    lo = lse - Z[rows, yi]
    P = ez / se
    P[rows, yi] -= 1.0
    return lo, P


def weighted_loss(xp, Z, y, w, loss):
    """``sum(w * loss) / sum(w)`` (a float) of :func:`pointwise_loss`, in
    float64 with ``xp``: early stopping's validation loss (no weight: nan)."""
    lo, _ = pointwise_loss(xp, xp.asarray(Z, dtype=xp.float64), y, loss)
    return float(xp.dot(w, lo) / w.sum())
