"""sklearn-cuwide: sparse wide models on NVIDIA GPUs behind the scikit-learn API.

Logistic regression and factorization machines trained the cuWide way
(feature-major tiles, flow-based aggregate / loss / apply steps), on a GPU
through CuPy when one is usable and on the CPU (numpy/scipy) otherwise.

Importing the package never imports cupy.
"""

from ._config import config_context, get_config, set_config
from ._fm import GPUFactorizationMachine, GPUFactorizationMachineRegressor
from ._logistic import GPULogisticRegression
from ._memory import InsufficientMemoryError
from ._read_ahead import read_ahead

__version__ = "0.1.0"

__all__ = [
    "GPULogisticRegression",
    "GPUFactorizationMachine",
    "GPUFactorizationMachineRegressor",
    "InsufficientMemoryError",
    "read_ahead",
    "config_context",
    "get_config",
    "set_config",
    "__version__",
]
