"""Where a fit's time goes: the stage lines of ``verbose=1``, read back.

A fit with ``verbose=1`` prints one line per setup stage, per epoch (or per
ten L-BFGS iterations) and a last ``Fit:`` line (``FitProgress`` in
``sklearn_cuwide/_state.py``).  The harness fits once more with it and keeps
the stages' seconds in order, the epochs and the iterations each summed into
one entry: the breakdown of the fit row's time, printed beside it.
"""

import contextlib
import io
import re
import time

_STAGE = re.compile(r"^Stage: (?P<name>.+?) in (?P<s>\d+\.\d+) s")
_EPOCH = re.compile(r"^Epoch \d+(?:/\d+)? in (?P<s>\d+\.\d+) s")
_ITERATIONS = re.compile(r"^Iterations? (?P<a>\d+)(?:-(?P<b>\d+))? in (?P<s>\d+\.\d+) s")
_FIT = re.compile(r"^Fit: (?P<s>\d+\.\d+) s")


def verbose_fit(est, X, y):
    """Fit ``est`` with ``verbose=1``; its wall-clock and the lines it printed."""
    out = io.StringIO()
    est.set_params(verbose=1)
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out):
        est.fit(X, y)
    return time.perf_counter() - t0, out.getvalue().splitlines()


def stage_times(lines):
    """The stages of a ``verbose=1`` log, in order: a list of
    ``[name, seconds, count]`` (count: the epochs or iterations an
    ``"epochs"`` or ``"iterations"`` entry sums, else 1), and the ``Fit:``
    line's total (None without one)."""
    stages, total = [], None

    def add(name, s, n):
        if stages and stages[-1][0] == name:  # consecutive epochs / iterations: one entry
            stages[-1][1] += s
            stages[-1][2] += n
        else:
            stages.append([name, s, n])

    for ln in lines:
        if m := _STAGE.match(ln):
            add(m["name"], float(m["s"]), 1)
        elif m := _EPOCH.match(ln):
            add("epochs", float(m["s"]), 1)
        elif m := _ITERATIONS.match(ln):
            a = int(m["a"])
            add("iterations", float(m["s"]), int(m["b"] or a) - a + 1)
        elif m := _FIT.match(ln):
            total = float(m["s"])
    return stages, total


def format_stages(stages):
    """One line of a stage list: ``name s · name s · epochs (3) s``."""
    return " · ".join(f"{name}{f' ({n})' if name in ('epochs', 'iterations') else ''} "
                      f"{s:.3f}" for name, s, n in stages)
