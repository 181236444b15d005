"""The package's settings, in scikit-learn's ``config_context`` style:
:func:`set_config`, :func:`get_config` and :func:`config_context`.

Like scikit-learn's, the settings are per thread: each thread starts from
the defaults and a change (``set_config``, or inside ``config_context``)
applies to the calling thread only, so that two threads fitting at once do
not see each other's settings.  Unlike scikit-learn's, they do not reach
the workers of ``n_jobs`` (scikit-learn's ``Parallel`` hands its own
settings on, and has no place for another package's): the environment
variable :data:`ENV_DEVICE_MEMORY_LIMIT`, read by each thread when it first
needs the settings, is the defaults' limit for the threads and processes
that have it.
"""

import math
import os
import threading
from contextlib import contextmanager
from numbers import Integral, Real

from sklearn.utils._param_validation import InvalidParameterError

__all__ = ["set_config", "get_config", "config_context", "ENV_DEVICE_MEMORY_LIMIT"]

_DEFAULTS = {"device_memory_limit": None}
_LOCAL = threading.local()
#: the environment variable whose value (a number of bytes, or a fraction in
#: (0, 1] written with a decimal point) is every thread's default
#: ``device_memory_limit`` where it is set and not empty
ENV_DEVICE_MEMORY_LIMIT = "SKLEARN_CUWIDE_DEVICE_MEMORY_LIMIT"

class _Unchanged:
    """"Not given": ``None`` is a value of ``device_memory_limit`` (the default)."""

    def __repr__(self):
        return "<unchanged>"


_UNCHANGED = _Unchanged()


def _local():
    """The calling thread's settings (a copy of the defaults at first use,
    the environment's limit among them)."""
    if not hasattr(_LOCAL, "config"):
        config = dict(_DEFAULTS)
        config["device_memory_limit"] = _environment_limit()
        _LOCAL.config = config
    return _LOCAL.config


def _environment_limit():
    """The ``device_memory_limit`` of :data:`ENV_DEVICE_MEMORY_LIMIT`
    (None where it is unset or empty): digits alone are an int of bytes,
    a number with a point or an exponent a fraction."""
    raw = os.environ.get(ENV_DEVICE_MEMORY_LIMIT, "").strip()
    if not raw:
        return None
    try:
        value = int(raw) if raw.lstrip("+").isdigit() else float(raw)
    except ValueError:
        value = raw
    try:
        return check_device_memory_limit(value)
    except InvalidParameterError as e:
        raise InvalidParameterError(
            f"The environment variable {ENV_DEVICE_MEMORY_LIMIT}={raw!r} is not a "
            f"device_memory_limit: {e}"
        ) from None


def check_device_memory_limit(limit):
    """``limit`` if it is a valid ``device_memory_limit``, else an
    ``InvalidParameterError`` (a ``ValueError`` and a ``TypeError``) that
    says what is accepted."""
    accepted = (
        "None (80% of the device's free memory), an int of bytes >= 1, or a float "
        "in (0, 1] (that fraction of the device's total memory)"
    )
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, Real):
        raise InvalidParameterError(
            f"device_memory_limit must be {accepted}; got {limit!r} of type "
            f"{type(limit).__name__}."
        )
    if isinstance(limit, Integral):
        if int(limit) < 1:
            raise InvalidParameterError(
                f"device_memory_limit must be {accepted}; got the int {limit!r}. "
                "An int is a number of bytes."
            )
        return int(limit)
    limit = float(limit)
    if not (math.isfinite(limit) and 0.0 < limit <= 1.0):
        hint = (" For a number of bytes pass an int, e.g. int(8e9)."
                if math.isfinite(limit) and limit > 1.0 else "")
        raise InvalidParameterError(
            f"device_memory_limit must be {accepted}; got the float {limit!r}, "
            f"outside (0, 1].{hint}"
        )
    return limit


def get_config():
    """The current values of the settings of :func:`set_config`.

    Returns
    -------
    config : dict
        Keys are the parameter names of :func:`set_config` (a copy: changing
        it changes nothing).

    Examples
    --------
    >>> import sklearn_cuwide
    >>> sklearn_cuwide.get_config()
    {'device_memory_limit': None}
    """
    return dict(_local())


def set_config(device_memory_limit=_UNCHANGED):
    """Set the package's settings for the calling thread.

    Parameters
    ----------
    device_memory_limit : int, float or None, default=None
        The device memory a fit or a prediction on a GPU may plan to use.
        An int is a number of bytes; a float in (0, 1] a fraction of the
        device's total memory; ``None`` 80% of the device's free memory at
        the time of the call. Either way no more than the device has free is
        planned. A fit whose training layout does not fit streams it from
        the host every epoch; a fit whose model does not fit keeps its
        rarest features' rows in host memory (out of core); a fit or
        prediction that cannot fit at all raises
        :class:`sklearn_cuwide.InsufficientMemoryError` before it allocates
        anything. A fit or prediction on the CPU (``device="cpu"``, or no
        GPU) ignores it: the host's available memory is what it plans
        against. Not given: unchanged. A thread's default is ``None``, or
        the value of the environment variable
        ``SKLEARN_CUWIDE_DEVICE_MEMORY_LIMIT`` where it is set (``"0.5"``,
        ``"8000000000"``): the way to reach the workers of ``n_jobs``,
        which these settings do not.

    See Also
    --------
    config_context : the same settings for a ``with`` block.
    get_config : the current settings.

    Examples
    --------
    >>> import sklearn_cuwide
    >>> sklearn_cuwide.set_config(device_memory_limit=0.5)
    >>> sklearn_cuwide.get_config()["device_memory_limit"]
    0.5
    >>> sklearn_cuwide.set_config(device_memory_limit=None)
    """
    config = _local()
    if device_memory_limit is not _UNCHANGED:
        config["device_memory_limit"] = check_device_memory_limit(device_memory_limit)


@contextmanager
def config_context(*, device_memory_limit=_UNCHANGED):
    """Settings of :func:`set_config` for a ``with`` block (of the calling
    thread); the previous ones come back at its end, even on an error.

    Parameters
    ----------
    device_memory_limit : int, float or None
        As in :func:`set_config`. Not given: unchanged.

    Yields
    ------
    None

    See Also
    --------
    set_config : the same settings, until changed again.
    get_config : the current settings.

    Examples
    --------
    >>> import sklearn_cuwide
    >>> with sklearn_cuwide.config_context(device_memory_limit=2**30):
    ...     sklearn_cuwide.get_config()["device_memory_limit"]
    1073741824
    >>> sklearn_cuwide.get_config()["device_memory_limit"] is None
    True
    """
    old = get_config()
    set_config(device_memory_limit=device_memory_limit)
    try:
        yield
    finally:
        _local().update(old)
