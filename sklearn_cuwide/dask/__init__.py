"""Data-parallel fits on a Dask cluster: ``sklearn_cuwide.dask``.

The three estimators of :mod:`sklearn_cuwide`, for data spread over the
workers of a ``dask.distributed`` cluster (one GPU per worker with
``dask_cuda.LocalCUDACluster``, or CPU workers).  Their fitted model is an
ordinary single-process estimator (:meth:`to_local`).  See :doc:`/dask`.
"""

from ._estimators import (
    GPUFactorizationMachine,
    GPUFactorizationMachineRegressor,
    GPULogisticRegression,
)

__all__ = ["GPULogisticRegression", "GPUFactorizationMachine",
           "GPUFactorizationMachineRegressor"]
