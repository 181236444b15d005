"""How the workers' buffers are summed: the reduction of every step.

A data-parallel step runs one task per partition at once; each computes a
flat float64 buffer (L-BFGS: the objective and its gradient; mini-batch
epochs: the row-weighted model and the losses).  A *communicator* says what
such a task returns and how the client turns the returns into the sum:

* :class:`DaskComm` -- through Dask itself: every task returns its buffer
  (on the host), the client gathers them and sums them in partition order.
  Any worker, any backend; the client receives ``P`` buffers per step.
* :class:`NcclComm` -- between the workers' GPUs: the tasks all-reduce their
  device buffers with NCCL (``cupy.cuda.nccl``) and only rank 0 returns the
  sum, so the client receives one buffer per step.  The NCCL unique id is
  made on the first worker and handed to the others through Dask.

The task side is :meth:`reduce_local` (picklable, run on the worker), the
client side :meth:`combine`.
"""

import threading
import uuid

import numpy as np

__all__ = ["DaskComm", "NcclComm", "make_comm"]


class DaskComm:
    """Sum through Dask: the client gathers every partition's buffer."""

    name = "dask"

    def setup(self, client, workers):
        """Nothing to set up: Dask's own connections carry the buffers."""

    def reduce_local(self, rank, buf):
        """The buffer on the host, returned as it is."""
        get = getattr(buf, "get", None)
        return np.asarray(get() if get is not None else buf, dtype=np.float64)

    def combine(self, returns):
        """The sum of the partitions' buffers, in partition order (a fixed
        order: the same data give the same sums every run)."""
        total = np.array(returns[0], dtype=np.float64)
        for r in returns[1:]:
            total += r
        return total

    def close(self, client):
        pass


#: NCCL communicators of this worker process, by (session, rank)
_NCCL_COMMS = {}
_NCCL_LOCK = threading.Lock()


def _nccl_unique_id():
    from cupy.cuda import nccl

    return nccl.get_unique_id()


def _nccl_init(session, n_ranks, uid, rank):
    """Join rank ``rank`` of the NCCL clique (blocks until all ranks join)."""
    from cupy.cuda import nccl

    comm = nccl.NcclCommunicator(n_ranks, uid, rank)
    with _NCCL_LOCK:
        _NCCL_COMMS[(session, rank)] = comm


def _nccl_close(session, rank):
    with _NCCL_LOCK:
        comm = _NCCL_COMMS.pop((session, rank), None)
    if comm is not None:
        comm.destroy()


class NcclComm:
    """All-reduce between the workers' GPUs with NCCL (not yet measured).

    Every partition's task must run at once (one task per worker: the
    estimators pin each partition to its own worker), as a collective does.
    """

    name = "nccl"

    def __init__(self):
        # unique across clients: several fits may share a cluster
        self.session = uuid.uuid4().hex
        self.n_ranks = 0

    def setup(self, client, workers):
        """One rank per worker of ``workers`` (the partitions' order); the
        unique id is made on the first and sent to the others by Dask."""
        self.n_ranks = len(workers)
        uid = client.submit(_nccl_unique_id, workers=[workers[0]], pure=False,
                            allow_other_workers=False).result()
        # every rank must be inside ncclCommInitRank at once: one task each
        futs = [
            client.submit(_nccl_init, self.session, self.n_ranks, uid, rank,
                          workers=[w], pure=False, allow_other_workers=False)
            for rank, w in enumerate(workers)
        ]
        client.gather(futs)
        self._workers = list(workers)

    def reduce_local(self, rank, buf):
        """Sum ``buf`` over the ranks in place on the device; rank 0 returns
        it on the host, the others None."""
        import cupy as cp
        from cupy.cuda import nccl

        comm = _NCCL_COMMS[(self.session, rank)]
        dbuf = cp.ascontiguousarray(cp.asarray(buf, dtype=cp.float64))
        stream = cp.cuda.get_current_stream()
        comm.allReduce(dbuf.data.ptr, dbuf.data.ptr, dbuf.size, nccl.NCCL_FLOAT64,
                       nccl.NCCL_SUM, stream.ptr)
        stream.synchronize()
        return dbuf.get() if rank == 0 else None

    def combine(self, returns):
        """Rank 0's return: the sum every rank holds."""
        return np.asarray(returns[0], dtype=np.float64)

    def close(self, client):
        futs = [client.submit(_nccl_close, self.session, rank, workers=[w], pure=False,
                              allow_other_workers=False)
                for rank, w in enumerate(getattr(self, "_workers", []))]
        client.gather(futs)


def make_comm(comm):
    """The ``comm`` parameter: ``"dask"``, ``"nccl"``, or a communicator."""
    if isinstance(comm, str) and comm == "dask":
        return DaskComm()
    if isinstance(comm, str) and comm == "nccl":
        return NcclComm()
    if all(hasattr(comm, m) for m in ("setup", "reduce_local", "combine", "close")):
        return comm
    raise ValueError(f"comm must be 'dask', 'nccl' or a communicator object, got {comm!r}")
