"""The benchmark suite (``benchmarks/run_all.py``) in its tiniest CPU mode.

One run of ``run_all.py --cpu --smoke`` (seconds), with the scikit-learn
fits in a worker process as on the GPU machine; then its output is checked
against references computed here: scikit-learn refitted on the same rows,
the floors, targets, ratios and log-log slopes recomputed from the recorded
numbers, and every GPU-only system recorded (not crashed) on a machine
without a GPU.  No timing is asserted.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "run_all.py"
sys.path.insert(0, str(ROOT / "benchmarks"))
import run_all  # noqa: E402
from sklearn_cuwide._backends import _concurrency  # noqa: E402


def _has(mod):
    try:
        __import__(mod)
        return True
    except Exception:
        return False


HAS_GPU = run_all._gpu_available()


def _run(args, tmp, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("suite")
    out = tmp / "out"
    proc = _run(["--cpu", "--smoke", "--sk-workers", "1", "--out", str(out)], tmp)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    return res, out, proc.stdout


def _main(res):
    (name, entry), = [(k, v) for k, v in res["systems"].items() if v.get("main")]
    return name, entry


def test_outputs_written_and_table_printed_last(smoke):
    res, out, stdout = smoke
    assert (out / "results.md").read_text().startswith("# sklearn-cuwide benchmark suite")
    lines = stdout.strip().splitlines()
    assert lines[-1].startswith("errors recorded:")
    last = max(i for i, line in enumerate(lines) if line.startswith("wrote "))
    assert any(line.startswith("ours LR adagrad (kernel)") for line in lines[last:])
    assert set(res["timings"]) >= {"env", "floors", "systems", "real", "ablation",
                                   "scaling", "finish"}


def test_environment_block(smoke):
    res, _, _ = smoke
    env = res["env"]
    import scipy
    import sklearn

    assert env["numpy"] == np.__version__
    assert env["scipy"] == scipy.__version__
    assert env["sklearn"] == sklearn.__version__
    assert env["cpu_count"] == os.cpu_count()
    assert "--smoke" in env["command"] and env["mode"] == "cpu"


def test_sklearn_results_match_a_refit_on_the_same_rows(smoke):
    """The data handling (prefix rows, test rows after the largest prefix)
    and the metrics, against scikit-learn refitted here."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    from sklearn_cuwide.datasets import make_ctr_classification

    res, _, _ = smoke
    _, entry = _main(res)
    info, sk = entry["info"], entry["systems"]["sk_lr"]
    assert "error" not in sk, sk
    total = info["rows"] + info["test_rows"]
    assert f"binary {total}x2^{int(math.log2(info['features']))}" in res["data_generated"]
    X, y = make_ctr_classification(n_samples=total, n_features=info["features"],
                                   model="fm", random_state=0)
    m = LogisticRegression(C=run_all.C_LR, tol=run_all.LBFGS_TOL,
                           max_iter=run_all.LBFGS_MAX_ITER).fit(X[: sk["rows"]], y[: sk["rows"]])
    z = m.decision_function(X[info["rows"]:])
    yt = y[info["rows"]:]
    assert sk["test_auc"] == pytest.approx(roc_auc_score(yt, z), abs=1e-9)
    ll = np.mean(np.logaddexp(0, z) - yt * z)
    assert sk["test_logloss"] == pytest.approx(ll, rel=1e-7)
    assert entry["target_logloss"] == pytest.approx(ll * run_all.TARGET_SLACK, rel=1e-7)
    # ours lbfgs: the same rows, the same objective
    ours = entry["systems"]["est_lr_lbfgs"]
    assert ours["rows"] == sk["rows"]
    assert ours["test_logloss"] == pytest.approx(ll, rel=2e-3)


def test_kernel_runs_train_and_derived_figures_are_consistent(smoke):
    res, _, _ = smoke
    _, entry = _main(res)
    info, systems = entry["info"], entry["systems"]
    assert info["floor_ms"] == pytest.approx(
        info["csr_bytes"] / res["floors"]["copy_bw"] * 1e3)
    ref = systems["ours_lr_adagrad"]
    for sid in ("ours_lr_adagrad", "ours_lr_sgd", "ours_fm"):
        r = systems[sid]
        assert "error" not in r, r
        assert r["rows"] == info["rows"] and len(r["curve"]) == r["epochs"]
        assert r["train_loss"][-1] < r["train_loss"][0]  # it learns
        assert r["test_auc"] > 0.55  # planted model: better than chance
        last = r["curve"][-1]
        assert r["test_auc"] == last["test_auc"] and r["test_logloss"] == last["test_logloss"]
        assert r["epoch_ms"] == pytest.approx(np.median(r["epoch_ms_list"][1:]))
        # time to target recomputed from the curve
        hit = [p["time_s"] for p in r["curve"] if p["test_logloss"] <= entry["target_logloss"]]
        assert r["time_to_target_s"] == (hit[0] if hit else math.inf)
        assert r["samples_per_s"] == pytest.approx(r["rows"] / (r["epoch_ms"] / 1e3))
    assert systems["ours_lr_sgd"]["x_ours"] == pytest.approx(
        systems["ours_lr_sgd"]["epoch_ms"] / ref["epoch_ms"])
    sgd = systems["sk_sgd"]
    assert sgd["x_ours"] == pytest.approx(
        (sgd["epoch_ms"] / sgd["rows"]) / (ref["epoch_ms"] / ref["rows"]))


@pytest.mark.skipif(HAS_GPU or _has("torch") or _has("cupy"),
                    reason="checks the records of a machine without GPU packages")
def test_gpu_only_systems_are_recorded_not_crashed(smoke):
    res, _, _ = smoke
    _, entry = _main(res)
    for sid in ("torch_lr", "torch_fm", "cusparse_lr", "cusparse_fm"):
        assert entry["systems"][sid]["error"].startswith("not available")
    for model, rows in res["ablation"]["models"].items():
        classic = next(r for r in rows if r["id"] == "classic")
        assert classic["error"].startswith("not available")
    assert len(res["errors"]) >= 6


def test_ablation_rows(smoke):
    res, _, _ = smoke
    models = res["ablation"]["models"]
    assert set(models) == {"LR", f"FM{res['config']['n_factors']}"}
    for rows in models.values():
        assert [r["id"] for r in rows] == [v[0] for v in run_all.ABLATION]
        ok = {r["id"]: r for r in rows if "epoch_ms" in r}
        assert set(ok) >= {"flow", "no_2d", "no_hot", "no_cross_stage", "no_replication",
                           "stream", "no_multistream"}
        assert ok["no_hot"]["n_hot"] == 0 and ok["flow"]["n_hot"] > 0
        assert ok["no_2d"]["sample_block"] == run_all.BATCH
        for r in ok.values():
            assert r["x_flow"] == pytest.approx(r["epoch_ms"] / ok["flow"]["epoch_ms"])
        # the CPU backend runs every variant with the same arithmetic
        assert ok["stream"]["test_auc"] == pytest.approx(ok["flow"]["test_auc"])


def test_scaling_slopes_recomputed(smoke):
    res, _, _ = smoke
    sc = res["scaling"]
    cfg = res["config"]
    assert [p["x"] for p in sc["rows"]["LR"]] == cfg["scale_rows"]
    assert [p["x"] for p in sc["factors"]["FM"]] == cfg["scale_factors"]
    for key, fit in sc["fits"].items():
        sweep, model = key.split(" ")
        pts = sc[sweep][model]
        xs, ys = [p["x"] for p in pts], [p["epoch_ms"] for p in pts]
        slope = np.polyfit(np.log(xs), np.log(ys), 1)[0]
        assert fit["slope"] == pytest.approx(slope)
    assert "linear" in sc["fits"]["rows LR"]


def test_real_datasets(smoke):
    import real_data

    res, _, _ = smoke
    avail = set(real_data.available_datasets())
    for name in res["config"]["real_datasets"]:
        if name not in avail:
            assert name in res["real_info"]["absent"]
            continue
        systems = res["real"][name]["systems"]
        if name == "movielens_100k":
            for sid in ("ours_fm_reg", "est_fm_reg", "sk_ridge"):
                assert math.isfinite(systems[sid]["test_rmse"]), systems[sid]
        else:
            for sid in ("ours_lr_adagrad", "est_lr_lbfgs", "sk_lr"):
                assert 0 <= systems[sid]["test_auc"] <= 1, systems[sid]


@pytest.mark.skipif(not _has("matplotlib"), reason="matplotlib is not installed")
def test_plots_written_and_redrawn_from_json(smoke, tmp_path):
    import plots

    res, out, _ = smoke
    names = ("systems.png", "ablation.png", "scaling.png")
    for name in names:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    made = plots.make_plots(json.loads((out / "results.json").read_text()), tmp_path)
    assert sorted(Path(p).name for p in made) == sorted(names)


def test_parts_and_skip_select_what_runs(tmp_path):
    out = tmp_path / "out"
    proc = _run(["--cpu", "--smoke", "--parts", "scaling", "--skip", "plots",
                 "--out", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    assert "scaling" in res and not {"systems", "real", "ablation", "floors"} & set(res)
    assert not list(out.glob("*.png"))


def test_bad_arguments_are_refused(tmp_path):
    for args in (["--parts", "bogus"], ["--skip", "nothing"]):
        proc = _run(["--cpu", *args, "--out", str(tmp_path)], tmp_path, timeout=60)
        assert proc.returncode == 2 and "error:" in proc.stderr


STAND_IN = """
import collections, json, sys, types
fake = types.ModuleType("cupy")  # only the memory pool the suite asks for


class Pool:
    def free_all_blocks(self):
        pass

    def total_bytes(self):
        return 0


fake.get_default_memory_pool = Pool
sys.modules["cupy"] = fake
sys.path[:0] = [sys.argv[1] + "/benchmarks", sys.argv[1]]
import run_all
import sklearn_cuwide._backends as backends
import sklearn_cuwide._device as device
from sklearn_cuwide._backends import _cpu

seen = collections.Counter()
run_epoch = _cpu.run_epoch


def spy(*a, **kw):
    seen[" ".join(sorted(kw))] += 1
    return run_epoch(*a, **kw)


_cpu.run_epoch = spy
_cpu.default_ramp = lambda params: 8
# the CUDA backend's resolution of ``concurrency``, with an H200's full grid
from sklearn_cuwide._backends import _concurrency
_cpu.concurrent_blocks = lambda conc, params, n: _concurrency.blocks(
    conc, params.model, params.solver, n, 264)
backends.get_backend = lambda dev: _cpu
device.resolve_device = lambda dev, X=None: "cpu"
run_all._gpu_available = lambda: True
if __name__ == "__main__":
    rc = run_all.main(sys.argv[3:])
    with open(sys.argv[2], "w") as f:
        json.dump(seen, f)
    sys.exit(rc)
"""


def test_gpu_mode_control_flow_on_a_cpu_stand_in(tmp_path):
    """``--gpu`` with the CPU backend standing in for the CUDA one (and a
    stand-in cupy memory pool): the warm-ups, the first-epoch ramp, the
    ablation switches, the estimators' warm-up fits and the scikit-learn
    worker process all run; the GPU-only baselines are recorded, not fatal."""
    driver = tmp_path / "driver.py"
    driver.write_text(STAND_IN)
    out, seen_path = tmp_path / "out", tmp_path / "seen.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, str(driver), str(ROOT), str(seen_path), "--gpu", "--smoke",
         "--sk-workers", "1", "--skip", "plots", "--out", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    seen = json.loads(seen_path.read_text())
    assert res["env"]["mode"] == "gpu"
    k = res["config"]["n_factors"]
    for key in (("linear", 0, "adagrad", "logistic"), ("linear", 0, "sgd", "logistic"),
                ("fm", k, "adagrad", "logistic"), ("fm", k, "adagrad", "squared")):
        assert f"kernel {key}" in res["compile_s"]
    assert {"estimator GPULogisticRegression", "estimator GPUFactorizationMachine"} <= set(
        res["compile_s"])
    # the first epoch of every fresh model warms the concurrency up; the
    # ablation's switches reach run_epoch (first epoch and later ones)
    assert seen["ramp"] > 0 and seen[""] > 0
    # the systems' ``concurrency`` reaches run_epoch as a grid
    assert seen["grid ramp"] > 0 and seen["grid"] > 0
    for switch in ("acc_global", "n_rep"):
        assert seen[f"{switch} ramp"] == 2 and seen[switch] == 2 * (res["config"]["epochs"] - 1)
    _, entry = _main(res)
    for sid in ("ours_lr_adagrad", "ours_fm", "ours_fm_auto", "ours_lr_sgd", "ours_lr_sgd_max",
                "est_lr_adagrad", "est_fm", "sk_lr", "sk_sgd"):
        assert "error" not in entry["systems"][sid], entry["systems"][sid]
        assert "test_auc" in entry["systems"][sid]
    for sid in ("torch_lr", "cusparse_lr"):
        assert "error" in entry["systems"][sid]
    assert entry["systems"]["ours_lr_adagrad"]["gpu_peak_bytes"] == 0  # the stand-in pool
    n_batches = -(-entry["systems"]["ours_fm"]["rows"] // run_all.BATCH)
    grid = _concurrency.grid_for(n_batches, 264)
    assert entry["systems"]["ours_fm"]["blocks"] == grid
    assert entry["systems"]["ours_fm_auto"]["blocks"] == min(4, grid)
    assert entry["systems"]["ours_lr_sgd"]["blocks"] == 1


def test_helpers_against_references():
    assert run_all.time_to_target(
        [{"time_s": 1.0, "test_logloss": 0.5}, {"time_s": 2.0, "test_logloss": 0.3}], 0.4) == 2.0
    assert run_all.time_to_target([{"time_s": 1.0, "test_logloss": 0.5}], 0.4) == math.inf
    x = np.array([1e3, 2e3, 4e3, 8e3])
    fit = run_all.loglog_slope(x, 3.0 * x ** 1.25)
    assert fit["slope"] == pytest.approx(1.25) and fit["r2"] == pytest.approx(1.0)
    z = np.array([-1.0, 0.5, 2.0, -0.2])
    y = np.array([0, 1, 1, 0])
    from sklearn.metrics import log_loss, roc_auc_score

    m = run_all.metrics("binary", y, z)
    assert m["test_logloss"] == pytest.approx(log_loss(y, 1 / (1 + np.exp(-z))))
    assert m["test_auc"] == pytest.approx(roc_auc_score(y, z))
    import scipy.sparse as sp

    X = sp.random(50, 7, density=0.3, format="csr", random_state=0)
    assert (run_all._csr_rows(X, 10, 30) != X[10:30]).nnz == 0


def test_renumbered_test_matrix_leaves_the_shared_one_alone():
    """The kernels predict a copy of the test rows in their layout's feature
    order; the test rows every other system predicts keep their values (the
    sort of the renumbered copy once moved them: the estimators and PyTorch
    were scored on scrambled real-valued rows)."""
    args = run_all.parse_args(["--cpu", "--smoke"])
    ctx = run_all.Ctx(False, run_all.make_config(args), args)
    rng = np.random.default_rng(0)
    Xt = sp.random(40, 30, density=0.3, format="csr", random_state=0, dtype=np.float64)
    Xt.data = rng.uniform(0.5, 2.0, Xt.nnz)
    before = Xt.copy()
    data = run_all.Data("t", "binary", Xt, np.zeros(40), Xt, np.zeros(40))
    rank = rng.permutation(30)
    got = ctx.test_matrix(data, rank)
    assert (data.Xt != before).nnz == 0
    assert np.array_equal(data.Xt.data, before.data)
    assert np.array_equal(data.Xt.indices, before.indices)
    # the renumbered copy: column rank[j] of it is column j of the test rows
    ref = before.toarray()
    want = np.zeros_like(ref)
    want[:, rank] = ref
    np.testing.assert_array_equal(got.toarray(), want)


def test_a_failed_device_skips_the_gpu_work_after_it():
    """A sticky CUDA error (the context unusable) is detected after the
    failing system; what follows is skipped with the reason, not run."""
    args = run_all.parse_args(["--cpu", "--smoke"])
    ctx = run_all.Ctx(False, run_all.make_config(args), args)
    ctx.gpu = True  # as on the GPU machine, where a failure is followed by a probe

    def broken_sync():
        raise RuntimeError("cudaErrorIllegalAddress: an illegal memory access")

    def failing():
        raise RuntimeError("kernel fault")

    ctx.sync = broken_sync
    rec = ctx.run("first", failing)
    assert rec["error"].startswith("RuntimeError: kernel fault")
    assert "illegal memory access" in ctx.dead and ctx.notes
    ran = []
    rec = ctx.run("next", lambda: (ctx.check_budget(), ran.append(1)))
    assert "device failed" in rec["skipped"] and not ran


def test_rows_linearity_judged_where_every_block_is_busy(smoke):
    res, _, _ = smoke
    sc = res["scaling"]
    for model, pts in sc["rows"].items():
        fit = sc["fits"][f"rows {model}"]
        busy = [p for p in pts if p["blocks"] * p["cluster"] == p["full_grid"]]
        assert busy == pts  # the CPU backend runs one block: always "full"
        assert fit["saturated"]["slope"] == pytest.approx(fit["slope"])
        assert fit["linear"] == bool(abs(fit["saturated"]["slope"] - 1.0) <= 0.15
                                     and fit["saturated"]["r2"] >= 0.98)


def test_busy_points_count_the_blocks_of_thread_block_clusters():
    """A rows point is judged "every block busy" by its workers times their
    cluster size against the full grid (the points before clusters carry no
    cluster size: plain blocks); the slope is fitted on those points only."""
    from plots import BUSY_SHARE, busy_grid

    full = 264
    assert busy_grid({"blocks": 61, "cluster": 4, "full_grid": full})  # 244 blocks
    assert not busy_grid({"blocks": 61, "full_grid": full})  # 61 plain blocks
    assert busy_grid({"blocks": 264, "full_grid": full})
    assert not busy_grid({"blocks": 100, "cluster": 2, "full_grid": full})
    assert busy_grid({"blocks": 1, "full_grid": 1}) and busy_grid({})  # the CPU
    edge = int(np.ceil(BUSY_SHARE * full))
    assert busy_grid({"blocks": edge, "full_grid": full})
    assert not busy_grid({"blocks": edge - 1, "full_grid": full})
    # a latency floor on an idle grid, then time proportional to the rows
    xs = [1, 2, 4, 8, 16]
    pts = [{"x": x, "epoch_ms": max(2.0, 0.6 * x), "blocks": min(full, 32 * x),
            "full_grid": full} for x in xs]
    fits = run_all.scaling_fits({"rows": {"LR": pts}})
    fit = fits["rows LR"]
    want = run_all.loglog_slope(xs[-2:], [0.6 * x for x in xs[-2:]])
    assert fit["saturated"]["slope"] == pytest.approx(want["slope"]) == pytest.approx(1.0)
    assert fit["slope"] < 0.9 and fit["linear"]
    for p in pts:  # the same points run as clusters: every one busy
        p["cluster"] = full // p["blocks"] if p["blocks"] < full else 1
    fit = run_all.scaling_fits({"rows": {"LR": pts}})["rows LR"]
    assert fit["saturated"]["slope"] == pytest.approx(fit["slope"])


def test_merge_results_takes_each_part_from_its_last_run(smoke, tmp_path):
    import copy

    import merge_results

    res, _, _ = smoke
    second = {k: copy.deepcopy(res[k]) for k in ("config", "env", "scaling")}
    second["env"]["command"] = "second run"
    second["timings"] = {"env": 1.0, "scaling": 2.0}
    for pts in second["scaling"]["rows"].values():
        for p in pts:
            p["epoch_ms"] *= 2.0
    merged = merge_results.merge([res, second], {"1": "abc1234"})
    assert merged["systems"] == res["systems"]  # only in the first run
    assert merged["scaling"] == second["scaling"]  # the last run that ran it
    assert [r["parts"] for r in merged["runs"]][1] == ["scaling"]
    assert merged["runs"][1]["env"]["git_commit"] == "abc1234"
    assert any("second run" in n and "abc1234" in n for n in merged["notes"])
    out = tmp_path / "merged"
    assert merge_results.main([str(out), *_write_runs(tmp_path, res, second)]) == 0
    md = (out / "results.md").read_text()
    assert "second run" in md and "## Scaling" in md


def _write_runs(tmp_path, *runs):
    paths = []
    for i, r in enumerate(runs):
        p = tmp_path / f"run{i}.json"
        p.write_text(json.dumps(r))
        paths.append(str(p))
    return paths


def test_tiled_rows_repeat_the_base_rows():
    import scipy.sparse as sp

    pool = run_all.DataPool(test_rows=0)
    base = pool.get("binary", 8, 300, test=False)
    d = pool.tiled("binary", 8, 700, 300)
    assert d.X.shape == (700, 2**8) and d.Xt.shape[0] == 0
    want = sp.vstack([base.X] * 3).tocsr()[:700]
    assert (d.X != want).nnz == 0
    np.testing.assert_array_equal(d.y, np.resize(base.y, 700))
    # a smaller tiled size reuses the larger one's rows
    assert (pool.tiled("binary", 8, 500, 300).X != want[:500]).nnz == 0


def test_merge_keeps_the_scaling_sweeps_a_later_run_left_out(smoke):
    import copy

    import merge_results

    res, _, _ = smoke
    rows_only = {k: copy.deepcopy(res[k]) for k in ("config", "env", "scaling")}
    rows_only["scaling"]["features"] = {}
    rows_only["scaling"]["factors"] = {}
    rows_only["scaling"]["fits"] = {k: v for k, v in res["scaling"]["fits"].items()
                                    if k.startswith("rows ")}
    for pts in rows_only["scaling"]["rows"].values():
        for p in pts:
            p["epoch_ms"] *= 3.0
    merged = merge_results.merge([res, rows_only])["scaling"]
    assert merged["rows"] == rows_only["scaling"]["rows"]
    assert merged["features"] == res["scaling"]["features"] and merged["features"]
    assert merged["factors"] == res["scaling"]["factors"] and merged["factors"]
    assert set(merged["fits"]) == set(res["scaling"]["fits"])
    for k, v in merged["fits"].items():
        assert v == (rows_only if k.startswith("rows ") else res)["scaling"]["fits"][k]


def test_merge_add_points_joins_a_later_runs_points(smoke):
    import copy

    import merge_results
    import run_all

    res, _, _ = smoke
    later = {k: copy.deepcopy(res[k]) for k in ("config", "env", "scaling")}
    later["scaling"]["features"] = {}
    later["scaling"]["factors"] = {}
    for pts in later["scaling"]["rows"].values():
        last = pts[-1]
        # one point past the earlier sweep, one re-measured at its last x
        pts[:] = [dict(last, epoch_ms=last["epoch_ms"] * 1.5),
                  dict(last, x=last["x"] * 2, epoch_ms=last["epoch_ms"] * 2)]
    merged = merge_results.merge([res, later], add_points=True)["scaling"]
    for model, pts in merged["rows"].items():
        old = res["scaling"]["rows"][model]
        assert [p["x"] for p in pts] == [p["x"] for p in old] + [old[-1]["x"] * 2]
        assert pts[:-2] == old[:-1]  # untouched, untagged
        assert [p["run"] for p in pts[-2:]] == [2, 2]
        assert pts[-2]["epoch_ms"] == old[-1]["epoch_ms"] * 1.5
    assert merged["features"] == res["scaling"]["features"]
    assert merged["fits"] == run_all.scaling_fits(merged)
    assert merged["fits"]["rows LR"] != res["scaling"]["fits"]["rows LR"]
