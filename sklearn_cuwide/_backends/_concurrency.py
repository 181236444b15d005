"""How many mini-batches the GPU trains at once (the ``concurrency``
parameter of the mini-batch estimators).

The CUDA training kernel runs ``P`` workers, each taking mini-batches from a
shared counter and updating the model without locks (Hogwild); a worker is
one thread block or a thread block cluster (:func:`cluster_for`).  With
``P = 1`` one worker applies the mini-batches strictly in order: the CPU
backend's semantics.  Larger ``P`` is faster, but a worker reads weights the
others are about to change, and whether the fit still converges as well as
the sequential order depends on the model and the solver: ``"auto"`` runs
the most workers that lost no test AUC against ``P = 1`` in the measurements
of :doc:`/design/concurrency` (the full grid for LR with Adagrad, 1 for sgd
and for the FM).  An FM's one worker is the whole grid: the CUDA backend's
in-order kernel runs every step on every block.

Pure functions of plain values (no cupy): the CUDA backend passes its full
grid in, and the CPU tests check the rule.
"""

from numbers import Integral

#: fewest mini-batches per worker and epoch before more workers are used
MIN_BATCHES_PER_BLOCK = 16

#: most workers ``concurrency="auto"`` runs, per (model, solver); None: the
#: full grid
AUTO_BLOCKS = {
    ("linear", "adagrad"): None,
    ("linear", "sgd"): 1,
    ("fm", "adagrad"): 1,
    ("fm", "sgd"): 1,
}


def grid_for(n_batches, full_grid):
    """The most workers an epoch of ``n_batches`` mini-batches runs on: the
    full grid (one block each), but at least MIN_BATCHES_PER_BLOCK
    mini-batches per worker (small data runs on fewer workers)."""
    return max(1, min(int(full_grid), int(n_batches) // MIN_BATCHES_PER_BLOCK))


def auto_blocks(model, solver):
    """Most workers ``"auto"`` runs for ``model`` ("linear"/"fm") and
    ``solver`` ("sgd"/"adagrad"); None for the full grid."""
    return AUTO_BLOCKS[model, solver]


def blocks(concurrency, model, solver, n_batches, full_grid):
    """Workers of an epoch for the estimators' ``concurrency``.

    ``"auto"``: the most that converges as well as the sequential order
    (:data:`AUTO_BLOCKS`); ``"max"``: every block the device runs at once;
    an int ``P >= 1``: at most ``P``.  Never more than :func:`grid_for`.
    """
    most = grid_for(n_batches, full_grid)
    if concurrency == "max":
        return most
    if concurrency == "auto":
        cap = auto_blocks(model, solver)
        return most if cap is None else min(most, cap)
    if isinstance(concurrency, Integral) and not isinstance(concurrency, bool) \
            and concurrency >= 1:
        return min(most, int(concurrency))
    raise ValueError(
        "concurrency must be 'auto', 'max' or an int >= 1, got "
        f"{concurrency!r}"
    )


#: thread blocks per worker the training kernel is built for (1: plain
#: blocks; 2, 4, 8: thread block clusters, the portable sizes, sm_90+)
CLUSTER_SIZES = (1, 2, 4, 8)


def cluster_for(workers, slots, sizes=CLUSTER_SIZES):
    """Thread blocks per worker for ``workers`` concurrent workers on a
    device that runs ``slots`` blocks at once: the largest size in
    ``sizes`` with which every worker still runs at once.

    A worker trains its mini-batches in order whatever its size, and a
    cluster of CL blocks trains a sample block in about 1/CL of one block's
    time: so few workers (little staleness) still fill the GPU, while the
    full grid runs plain blocks, the fastest when every block is busy
    (a cluster barrier waits for its slowest block).  See
    :doc:`/design/concurrency`.
    """
    for cl in sorted(sizes, reverse=True):
        if int(workers) * int(cl) <= int(slots):
            return int(cl)
    return 1


# --------------------------------------------------------------------------
# steps under concurrency: a worker's step is damped by how many others
# update the same feature from the same stale weights
# --------------------------------------------------------------------------
def default_staleness(model, solver):
    """The step policy under concurrency (see :doc:`/design/staleness`):
    ``"sqrt"`` for sgd (its step of 1 / L needs the concurrent steps divided
    by sqrt(#updaters)); ``"cap-auto"`` for the FM and ``"cap-step"`` for LR
    with Adagrad (undamped up to C expected concurrent updaters, scaled by
    C / updaters beyond: lock-free sums keep LR's AUC but overshoot its
    logloss on the features present in every row)."""
    if solver == "sgd":
        return "sqrt"
    return "cap-auto" if model == "fm" else "cap-step"


#: ``"cap-step"``: the summed undamped first steps of a feature (Adagrad's
#: first step is ``learning_rate`` in size) move it by at most this much
STEP_BOUND = 2.0


def staleness_cap(staleness, n_blocks, learning_rate=None):
    """C of a ``"capC"`` / ``"cap-auto"`` / ``"cap-step"`` policy for
    ``n_blocks`` workers (None for the other policies).

    ``"cap-auto"``: C = max(4, P / 11), for the FM; ``"cap-step"``:
    C = max(4, STEP_BOUND / learning_rate), for LR.  P is the epoch's full
    grid, also in the warm-up stages (their fewer workers are then damped
    less or not at all).
    """
    if not (isinstance(staleness, str) and staleness.startswith("cap")):
        return None
    if staleness == "cap-auto":
        return max(4.0, n_blocks / 11.0)
    if staleness == "cap-step":
        return max(4.0, STEP_BOUND / float(learning_rate))
    return float(staleness[3:])


def default_ramp(model):
    """Mini-batches per worker of each stage of the first epoch's warm-up
    (1, 2, 4, ... workers before the full grid): the first steps move the
    model most, so they are taken from the freshest weights."""
    return 32 if model == "fm" else 8


def ramp_stages(ramp, grid):
    """The warm-up stages ``[(workers, mini-batches), ...]`` of ``ramp``
    mini-batches per worker before ``grid`` workers (none when ``ramp`` is 0)."""
    stages, P = [], 1
    while ramp and P < grid:
        stages.append((P, int(ramp) * P))
        P *= 2
    return stages
