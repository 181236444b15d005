"""sklearn_cuwide.set_config / get_config / config_context: the
device-memory limit, validated, per thread, restored after a block."""

import threading

import pytest

import sklearn_cuwide
from sklearn_cuwide import config_context, get_config, set_config


def test_exported_and_default():
    for name in ("config_context", "get_config", "set_config", "InsufficientMemoryError"):
        assert name in sklearn_cuwide.__all__
    assert get_config() == {"device_memory_limit": None}
    assert issubclass(sklearn_cuwide.InsufficientMemoryError, MemoryError)


@pytest.mark.parametrize("limit", [1, 2**33, 0.25, 1.0, None])
def test_context_sets_and_restores(limit):
    with config_context(device_memory_limit=0.5):
        with config_context(device_memory_limit=limit):
            assert get_config()["device_memory_limit"] == limit
        assert get_config()["device_memory_limit"] == 0.5
        with config_context():  # nothing given: unchanged
            assert get_config()["device_memory_limit"] == 0.5
    assert get_config()["device_memory_limit"] is None


def test_context_restores_after_an_error():
    with pytest.raises(RuntimeError):
        with config_context(device_memory_limit=123):
            raise RuntimeError
    assert get_config()["device_memory_limit"] is None


def test_set_config_and_get_config_copy():
    try:
        set_config(device_memory_limit=10**9)
        cfg = get_config()
        cfg["device_memory_limit"] = 5
        assert get_config()["device_memory_limit"] == 10**9
        set_config()  # nothing given: unchanged
        assert get_config()["device_memory_limit"] == 10**9
    finally:
        set_config(device_memory_limit=None)


@pytest.mark.parametrize("bad, match", [
    (0, "got the int 0"), (-5, "got the int -5"), (0.0, r"outside \(0, 1\]"),
    (1.5, "pass an int"), (float("nan"), "outside"), (True, "type bool"),
    ("8GB", "type str"), ([1], "type list"),
])
def test_invalid_limits(bad, match):
    with pytest.raises(ValueError, match=match):
        set_config(device_memory_limit=bad)
    with pytest.raises(TypeError, match=match):  # InvalidParameterError is both
        with config_context(device_memory_limit=bad):
            pass  # pragma: no cover
    assert get_config()["device_memory_limit"] is None


def test_numpy_scalars_are_accepted():
    np = pytest.importorskip("numpy")
    with config_context(device_memory_limit=np.int64(1024)):
        assert get_config()["device_memory_limit"] == 1024
        assert type(get_config()["device_memory_limit"]) is int
    with config_context(device_memory_limit=np.float32(0.5)):
        assert get_config()["device_memory_limit"] == 0.5


def test_settings_are_per_thread():
    """A thread starts from the defaults and its changes stay its own, as
    scikit-learn's config."""
    seen = {}
    go, set_ = threading.Event(), threading.Event()

    def other():
        seen["start"] = get_config()["device_memory_limit"]
        with config_context(device_memory_limit=7):
            set_.set()
            go.wait(5)
            seen["inside"] = get_config()["device_memory_limit"]

    with config_context(device_memory_limit=0.5):
        t = threading.Thread(target=other)
        t.start()
        set_.wait(5)
        assert get_config()["device_memory_limit"] == 0.5  # not the thread's 7
        go.set()
        t.join()
    assert seen == {"start": None, "inside": 7}


ENV = "SKLEARN_CUWIDE_DEVICE_MEMORY_LIMIT"


def _in_new_thread(fn):
    out = {}

    def run():
        try:
            out["value"] = fn()
        except Exception as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out


@pytest.mark.parametrize("raw, want", [("0.5", 0.5), ("8000000000", 8_000_000_000),
                                       (" 1e-1 ", 0.1), ("", None)])
def test_environment_variable_is_each_new_threads_default(monkeypatch, raw, want):
    """The environment's limit is a thread's default (read when it first
    needs the settings); its own setting wins and a block restores to it."""
    assert sklearn_cuwide._config.ENV_DEVICE_MEMORY_LIMIT == ENV
    monkeypatch.setenv(ENV, raw)

    def settings():
        first = get_config()["device_memory_limit"]
        with config_context(device_memory_limit=123):
            inner = get_config()["device_memory_limit"]
        return first, inner, get_config()["device_memory_limit"]

    assert _in_new_thread(settings)["value"] == (want, 123, want)


@pytest.mark.parametrize("raw", ["abc", "2.5", "0", "-3", "nan"])
def test_environment_variable_invalid_raises_naming_it(monkeypatch, raw):
    monkeypatch.setenv(ENV, raw)
    err = _in_new_thread(get_config)["error"]
    assert isinstance(err, ValueError) and f"{ENV}={raw!r}" in str(err)


def test_environment_variable_reaches_joblib_worker_processes():
    """What the settings themselves do not: the workers of ``n_jobs``
    (loky's processes, started with the environment) see the limit."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "from joblib import Parallel, delayed\n"
        "def limit():\n"
        "    import sklearn_cuwide\n"
        "    return sklearn_cuwide.get_config()['device_memory_limit']\n"
        "print(Parallel(n_jobs=2, backend='loky')(delayed(limit)() for _ in range(4)))\n"
    )
    env = dict(os.environ, **{ENV: "0.25"},
               PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[0.25, 0.25, 0.25, 0.25]"
