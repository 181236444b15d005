"""The package's warnings, attributed to the user's call."""

import os
import sys
import warnings

__all__ = ["warn"]

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_SKLEARN_BASE = os.path.join("sklearn", "base.py")


def warn(message, category):
    """``warnings.warn`` with the line of the first caller outside the
    package and scikit-learn's ``_fit_context`` wrapper of every ``fit``:
    the user's call (or scikit-learn's, for a search).

    Rule: no fixed ``stacklevel``.  Why: a warning can be raised at any depth
    of the package (a decorator, one head of several), and a fixed level
    names an internal line instead of the call the user wrote."""
    level, frame = 2, sys._getframe(1)
    while frame is not None and _internal(frame.f_code):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def _internal(code):
    path = os.path.abspath(code.co_filename)
    return path.startswith(_PACKAGE) or (
        code.co_name == "wrapper" and path.endswith(_SKLEARN_BASE))
