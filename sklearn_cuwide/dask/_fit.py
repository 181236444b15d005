"""The client's side of a data-parallel fit: the drivers.

Both take the partitions (futures of :class:`._shard.Shard`, one per
worker), their workers and a communicator (:mod:`._comm`), and return
arrays; neither sees an estimator.

* :func:`fit_lbfgs` -- full-batch L-BFGS: the single-process driver
  (:func:`sklearn_cuwide._solvers.fit_lbfgs_summed`) on the client, each
  objective evaluation one task per partition whose data terms are summed.
* :func:`fit_epochs` -- the mini-batch solvers: per epoch (or per round of
  ``sync_every`` mini-batches), every partition trains its own tile layout
  from the current global model with the single-process step
  (``backend.run_epoch``), and the models (and Adagrad's accumulators) are
  averaged, weighted by the partitions' rows.
"""

import numpy as np

from .._backends import _concurrency
from .._minibatch import HeadResult
from .._solvers import (
    _diverged,
    check_finite_state,
    fit_lbfgs_summed,
    training_loss_stop,
    training_stalled,
)
from .._state import FitProgress
from . import _shard
from ._data import on_workers

__all__ = ["fit_lbfgs", "fit_epochs"]


def fit_lbfgs(client, shards, workers, comm, *, loss, n_features, n_outputs, n_rows,
              total_weight, C, fit_intercept, max_iter, tol, progress=None):
    """Data-parallel L-BFGS (scikit-learn's objective, as the single-process
    fit): returns ``(coef, intercept, n_iter, loss_curve)``."""
    progress = FitProgress(0) if progress is None else progress
    shards = on_workers(client, _shard.with_objective, shards, workers, loss=loss,
                        n_outputs=n_outputs, total_weight=total_weight,
                        fit_intercept=fit_intercept)
    progress.stage("partitions on their devices")

    def data_fun_grad(x):
        [xf] = client.scatter([x], broadcast=True)
        futs = [client.submit(_shard.lbfgs_evaluate, s, xf, comm, rank, workers=[w],
                              allow_other_workers=False, pure=False)
                for rank, (s, w) in enumerate(zip(shards, workers))]
        buf = comm.combine(client.gather(futs))
        return buf[0], buf[1:]

    return fit_lbfgs_summed(
        data_fun_grad, n_features=n_features, n_outputs=n_outputs,
        total_weight=total_weight, C=C, fit_intercept=fit_intercept,
        max_iter=max_iter, tol=tol, n_samples=n_rows, progress=progress,
    )


def epoch_seeds(seed, rank, n_heads, head):
    """The seed of partition ``rank``'s epochs of head ``head``: the
    single-process fit's for partition 0 (``seed + head``), offset by
    ``rank * n_heads`` for the others."""
    return seed + rank * n_heads + head


def fit_epochs(client, shards, workers, comm, *, params, states, heads, n_outputs,
               n_factors, batch_size, max_iter, tol, n_iter_no_change, shuffle,
               concurrency, seed_layout, seed_epochs, total_weight, sync_every=None,
               progress=None):
    """Data-parallel epochs with model averaging.

    Parameters
    ----------
    params : StepParams
    states : list of ModelState
        Each head's starting state (numpy, user feature order).
    heads : list
        What each head trains on (see :func:`._shard._head_target`): ``None``
        (the partition's targets) or a class index (one-vs-rest).
    total_weight : float
        The sum of the training weights (the epochs' mean loss).
    seed_layout, seed_epochs : int
        Partition ``k``'s layout is shuffled with ``seed_layout + k`` and its
        epochs drawn from :func:`epoch_seeds`: one partition trains exactly
        as the single-process fit with the same seeds.
    sync_every : int or None
        Average the models every ``sync_every`` mini-batches of the partition
        with the most (every partition cut into as many rounds); None: once
        per epoch.

    Returns
    -------
    list of HeadResult (one per head)
    """
    progress = FitProgress(0) if progress is None else progress
    n_heads = len(heads)
    shards = [
        client.submit(_shard.with_layout, s, params, heads, batch_size=batch_size,
                      n_outputs=n_outputs, n_factors=n_factors, shuffle=shuffle,
                      seed=seed_layout + rank, concurrency=concurrency, workers=[w],
                      allow_other_workers=False, pure=False)
        for rank, (s, w) in enumerate(zip(shards, workers))
    ]
    most = max(client.gather(on_workers(client, _shard.n_batches, shards, workers)))
    n_rounds = 1 if sync_every is None else max(1, -(-most // int(sync_every)))
    progress.stage("layouts")
    rngs = [[np.random.default_rng(epoch_seeds(seed_epochs, r, n_heads, h))
             .bit_generator.state for h in range(n_heads)] for r in range(len(shards))]
    ramp = _concurrency.default_ramp(params.model)
    states = list(states)
    active = list(range(n_heads))
    n_iter = [0] * n_heads
    curves = [[] for _ in range(n_heads)]
    loss_limit = float(np.finfo(states[0].w.dtype).max)
    for epoch in range(int(max_iter)):
        if not active:
            break
        loss_sums = np.zeros(len(active))
        for round_ in range(n_rounds):
            cur = [states[h] for h in active]
            [sf] = client.scatter([cur], broadcast=True)
            futs = [
                client.submit(_shard.train_round, s, sf, params, active,
                              [rngs[rank][h] for h in active], comm, rank,
                              shuffle=shuffle,
                              ramp=ramp if epoch == 0 and round_ == 0 else 0,
                              round_=round_, n_rounds=n_rounds, workers=[w],
                              allow_other_workers=False, pure=False)
                for rank, (s, w) in enumerate(zip(shards, workers))
            ]
            returns = client.gather(futs)
            total = comm.combine([r for r, _ in returns])
            _, spec = _shard.pack_states(cur)
            size = total.size - 1 - len(active)
            rows = total[size]
            new = _shard.unpack_states(total[:size] / rows, spec, len(active),
                                       dtype=cur[0].w.dtype)
            for h, st in zip(active, new):
                states[h] = st
            loss_sums += total[size + 1:]
        # every round drew the epoch's order from its start: now move on
        for rank, (_, rs) in enumerate(returns):
            for h, st in zip(active, rs):
                rngs[rank][h] = st
        still = []
        for h, ep_loss in zip(active, loss_sums / total_weight):
            n_iter[h] = epoch + 1
            if not ep_loss <= loss_limit:
                raise _diverged(f"the training loss of epoch {epoch + 1} is "
                                f"{ep_loss:.4g}", params)
            curves[h].append(float(ep_loss))
            prefix = "" if n_heads == 1 else f"model {h + 1} of {n_heads}, "
            label = f"{prefix}epoch {epoch + 1}"
            progress.step(label[0].upper() + label[1:], f"loss {ep_loss:.6f}",
                          int(rows))
            stop = False
            if tol is not None:
                stop = training_stalled(curves[h], tol, n_iter_no_change)
                if stop and epoch + 1 < max_iter:
                    progress.note(training_loss_stop(prefix, epoch + 1, n_iter_no_change,
                                                     tol))
            if not stop:
                still.append(h)
        active = still
    for h, st in enumerate(states):
        check_finite_state(st, n_iter[h], params)
    return [HeadResult(st, n, c) for st, n, c in zip(states, n_iter, curves)]
