"""The real-data loaders under their old module name, for the tests that put
``benchmarks/`` on ``sys.path`` and ``import real_data``; they live in
:mod:`benchmarks.data`.  Remove once those tests import ``benchmarks.data``."""

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from benchmarks.data import (  # noqa: E402,F401
    DATASETS,
    ENV_VAR,
    Dataset,
    available_datasets,
    data_dir,
    load,
)
