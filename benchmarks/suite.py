"""The parts of a run and the command line (``python -m benchmarks``).

Parts (``--parts``, all by default; ``env`` always runs): ``floors``,
``startup`` (the first fit of a fresh process, kernel cache cold and warm),
``systems`` (the Criteo-like synthetic task, and its regression twin),
``real`` (every real dataset present), ``ablation`` (the classic schema
against the flow-based kernel, then each optimisation off; LR and FM) and
``scaling`` (epoch time against rows, features and ``n_factors``).  Nothing
new starts after ``--budget-s``; what is skipped says so.
"""

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

from . import report
from .configs import (
    BATCH,
    C_LR,
    LEARNING_RATE,
    PARTS,
    SKIPPABLE,
    TORCH_GRIDS,
    make_config,
)
from . import startup
from .data import Data, DataPool, available_datasets, csr_bytes, csr_rows, data_dir, load
from .data import DATASETS as REAL_DATASETS
from .systems import (
    SK_LABELS,
    Ctx,
    Jobs,
    NotAvailable,
    err_text,
    floors,
    log,
    ours_epochs,
    sklearn_specs,
    system_list,
)

ROOT = Path(__file__).resolve().parents[1]


def gpu_available():
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


#: modules whose version is read from their metadata (importing them only for
#: a version costs seconds)
_BY_METADATA = ("torch", "matplotlib")


def _version(mod):
    from importlib import metadata

    if mod in _BY_METADATA:
        try:
            return metadata.version(mod)
        except metadata.PackageNotFoundError as exc:
            return f"absent ({type(exc).__name__})"
    try:
        return getattr(__import__(mod), "__version__", "?")
    except Exception as exc:
        return f"absent ({type(exc).__name__})"


def _git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=10).stdout


def part_env(ctx, argv):
    env = {"command": "python -m benchmarks " + " ".join(shlex.quote(a) for a in argv),
           "cwd": os.getcwd(), "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
           "mode": ctx.cfg["mode"], "device": ctx.device_name, "python": platform.python_version(),
           "platform": platform.platform(), "cpu_count": os.cpu_count()}
    for mod in ("numpy", "scipy", "sklearn", "sklearn_cuwide", "cupy", "torch", "matplotlib"):
        env[mod] = _version(mod)
    try:
        with open("/proc/cpuinfo") as f:
            env["cpu_model"] = next(ln.split(":", 1)[1].strip() for ln in f
                                    if ln.startswith("model name"))
    except Exception:
        pass
    # BENCH_COMMIT names the commit where the tree's .git cannot (a copy of
    # the working tree whose .git is stale, as on a lent GPU machine)
    if os.environ.get("BENCH_COMMIT"):
        env["git_commit"] = os.environ["BENCH_COMMIT"]
        env["git_dirty_files"] = "given by BENCH_COMMIT"
    else:
        try:
            env["git_commit"] = _git("rev-parse", "HEAD").strip() or None
            env["git_dirty_files"] = len([x for x in _git("status", "--porcelain").splitlines()
                                          if x.strip()])
        except Exception:
            env["git_commit"] = None
    if ctx.gpu:
        try:
            import cupy as cp

            rt = cp.cuda.runtime
            p = rt.getDeviceProperties(0)
            name = p["name"].decode() if isinstance(p["name"], bytes) else p["name"]
            env.update(gpu=name, gpu_sms=int(p["multiProcessorCount"]),
                       gpu_memory_bytes=int(p["totalGlobalMem"]),
                       compute_capability=f"{p['major']}.{p['minor']}",
                       shared_mem_per_sm=int(p["sharedMemPerMultiprocessor"]),
                       cuda_driver_api=int(rt.driverGetVersion()),
                       cuda_runtime=int(rt.runtimeGetVersion()))
        except Exception as exc:
            env["gpu_error"] = err_text(exc)
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                "--format=csv,noheader"], capture_output=True, text=True,
                               timeout=20).stdout.strip()
            env["nvidia_smi"] = q
            env["driver"] = q.split(",")[1].strip() if q else None
        except Exception as exc:
            env["driver"] = f"unknown ({err_text(exc)})"
    log("  " + ", ".join(f"{k}={v}" for k, v in env.items() if k != "cwd"))
    return env


# --------------------------------------------------------------------------
# systems and real data
# --------------------------------------------------------------------------
def dataset_info(data, fl):
    info = {"key": data.key, "source": data.source, "task": data.task, "rows": data.n,
            "test_rows": int(data.Xt.shape[0]), "features": data.d, "nnz": int(data.X.nnz),
            "nnz_per_row": data.X.nnz / max(data.n, 1), "csr_bytes": csr_bytes(data.X)}
    if fl and fl.get("copy_bw"):
        info["floor_ms"] = info["csr_bytes"] / fl["copy_bw"] * 1e3
    if fl and fl.get("h2d_bw"):
        info["h2d_ms"] = info["csr_bytes"] / fl["h2d_bw"] * 1e3
    return info


def one_line(label, rec):
    if "error" in rec:
        return f"{label:48s} ERROR {rec['error'][:110]}"
    if "skipped" in rec:
        return f"{label:48s} skipped: {rec['skipped'][:100]}"
    bits = []
    for key, fmt in (("epoch_ms", "epoch {:.3f} ms"), ("fit_s", "fit {:.2f} s"),
                     ("test_auc", "AUC {:.4f}"), ("test_logloss", "logloss {:.4f}"),
                     ("test_rmse", "RMSE {:.4f}")):
        if rec.get(key) is not None:
            bits.append(fmt.format(rec[key]))
    if rec.get("gpu_peak_bytes"):
        bits.append(f"GPU peak {rec['gpu_peak_bytes'] / 2**20:.0f} MiB")
    return f"{label:48s} " + ", ".join(bits)


def run_dataset(ctx, data, jobs, fl, *, real):
    """Every system on one dataset; the scikit-learn fits are left pending."""
    cfg = ctx.cfg
    info = dataset_info(data, fl)
    log(f"\n== {data.key}: {data.n:,} train rows, {info['test_rows']:,} test, "
        f"{data.d:,} features, {info['nnz_per_row']:.1f} nnz/row")
    pending, systems = {}, {}
    if not ctx.skipped("sklearn"):
        specs = sklearn_specs(data, epochs=cfg["real_epochs"] if real else cfg["epochs"],
                              sk_rows=data.n if real else cfg["sk_rows"],
                              sgd_rows=data.n if real else cfg["sgd_rows"], real=real)
        for sid, (rows, spec) in specs.items():
            if ctx.left() > 0:
                pending[sid] = jobs.submit(spec, key=(data.base or data.key, rows, sid))
            else:
                label, family = SK_LABELS[sid]
                systems[sid] = {"skipped": f"time budget of {ctx.budget_s:.0f} s used up",
                                "label": label, "family": family}
    for sid, label, family, thunk in system_list(ctx, data, real=real):
        rec = ctx.run(label, thunk)
        rec.update(label=label, family=family)
        systems[sid] = rec
        log("  " + one_line(label, rec))
    return {"info": info, "systems": systems, "pending": pending}


def part_systems(ctx, pool, jobs, fl):
    cfg, out = ctx.cfg, {}
    main_rows = max(r for r, _ in cfg["systems_data"])
    for rows, lf in cfg["systems_data"]:
        data = pool.get("binary", lf, rows)
        out[data.key] = run_dataset(ctx, data, jobs, fl, real=False)
        out[data.key]["main"] = rows == main_rows
    if not ctx.skipped("regression"):
        rows, lf = cfg["systems_data"][0]
        data = pool.get("regression", lf, min(rows, cfg["reg_rows"]))
        out[data.key] = run_dataset(ctx, data, jobs, fl, real=False)
    return out


def part_real(ctx, jobs, fl, names=None):
    cfg = ctx.cfg
    avail = available_datasets()
    out, absent = {}, []
    for name in names or cfg["real_datasets"] or REAL_DATASETS:
        if name not in avail:
            absent.append(name)
            continue
        if ctx.left() <= 0:
            out[name] = {"skipped": "time budget used up"}
            continue
        try:
            ds = load(name)
        except Exception as exc:
            out[name] = {"error": err_text(exc)}
            continue
        X, y, Xt, yt = ds.X_train, ds.y_train, ds.X_test, ds.y_test
        cap = cfg["real_max_rows"]
        if cap:
            X, y = csr_rows(X, 0, min(cap, X.shape[0])), y[:cap]
            Xt, yt = csr_rows(Xt, 0, min(cap, Xt.shape[0])), yt[:cap]
        data = Data(name, ds.task, X, y, Xt, yt, source="real")
        out[name] = run_dataset(ctx, data, jobs, fl, real=True)
    return out, {"data_dir": str(data_dir()), "absent": absent}


def finish(ctx, res, jobs):
    """The scikit-learn results, then every dataset's derived figures."""
    for part in ("systems", "real"):
        for name, entry in report.entries(res.get(part)).items():
            for sid, handle in entry.pop("pending", {}).items():
                rec = jobs.result(handle, timeout=ctx.left() + 30)
                rec.update(label=SK_LABELS[sid][0], family=SK_LABELS[sid][1])
                entry["systems"][sid] = rec
                log(f"  {name}: " + one_line(rec["label"], rec))
            report.derive(entry)


# --------------------------------------------------------------------------
# start-up
# --------------------------------------------------------------------------
def part_startup(ctx):
    """Each model's first fit in a fresh process, CuPy's kernel cache empty
    and then warm (:mod:`benchmarks.startup`)."""
    out = {"rows": ctx.cfg["startup_rows"], "cold_target_s": startup.COLD_TARGET_S,
           "warm_over_target_s": startup.WARM_OVER_TARGET_S, "models": {}}
    for mid, label, _ in (m for m in startup.MODELS if m[0] in ctx.cfg["startup_models"]):
        def one(mid=mid):
            ctx.check_budget()
            return startup.measure(mid, ctx.cfg["startup_rows"], ctx.device)

        rec = ctx.run(f"startup {mid}", one)
        rec["label"] = label
        out["models"][mid] = rec
        log(f"  {label:48s} " + (
            f"cold {rec['cold_first_fit_s']:.2f} s, warm cache {rec['warm_cache_first_fit_s']:.2f}"
            f" s, warm {rec['warm_fit_s']:.3f} s" if "cold_first_fit_s" in rec else
            (rec.get("error") or rec.get("skipped", ""))[:100]))
    return out


# --------------------------------------------------------------------------
# ablation and scaling
# --------------------------------------------------------------------------
ABLATION = [  # id, time_epochs variant, label
    ("classic", "classic", "classic schema (per-sample pull/push, global atomics)"),
    ("flow", "flow", "flow-based kernel, all optimisations"),
    ("no_hot", "no_hot_cache", "- hot-feature caching (n_hot = 0)"),
    ("no_cross_stage", "global_accumulators",
     "- cross-stage caching (per-sample accumulators in global memory)"),
    ("no_replication", "no_replicas", "- replication (one replica of the hot accumulators)"),
]


def _models(ctx, k, concurrency):
    """LR adagrad and FM(k) adagrad at the suite's settings."""
    from sklearn_cuwide import GPUFactorizationMachine, GPULogisticRegression

    fa, fb = ctx.cfg["fm_l2"]
    mb = dict(batch_size=BATCH, learning_rate=LEARNING_RATE, random_state=0,
              device=ctx.device, concurrency=concurrency)
    return (("LR", lambda: GPULogisticRegression(solver="adagrad", C=C_LR, **mb)),
            (f"FM{k}", lambda: GPUFactorizationMachine(n_factors=k, alpha=fa, beta=fb, **mb)))


def part_ablation(ctx, pool):
    cfg = ctx.cfg
    rows, lf = cfg["ablation_data"]
    data = pool.get("binary", lf, rows)
    out, recs = {"data": data.key, "models": {}}, {}
    models = _models(ctx, cfg["n_factors"], "max")
    # the classic schema (another kernel) last: a fault there cannot cost the other rows
    plan = [(m, make, a) for m, make in models for a in ABLATION if a[0] != "classic"]
    if not ctx.skipped("classic"):
        plan += [(m, make, a) for m, make in models for a in ABLATION if a[0] == "classic"]

    def row(make, variant):
        if not ctx.gpu and variant != "flow":
            raise NotAvailable("a GPU-only variant")
        return ours_epochs(ctx, data, make, epochs=cfg["epochs"], variant=variant)

    for model, make, (vid, variant, label) in plan:
        rec = ctx.run(label, row, make, variant)
        rec.update(id=vid, variant=variant, label=label)
        recs[model, vid] = rec
        log(f"  {model:5s} " + one_line(label, rec))
    for model, _ in models:
        rows_out = [recs[model, a[0]] for a in ABLATION if (model, a[0]) in recs]
        flow = recs.get((model, "flow"), {})
        for r in rows_out:
            if flow.get("epoch_ms") and r.get("epoch_ms"):
                r["x_flow"] = r["epoch_ms"] / flow["epoch_ms"]
        out["models"][model] = rows_out
    return out


def part_scaling(ctx, pool, fl):
    cfg = ctx.cfg
    k = cfg["n_factors"]
    out = {"rows": {}, "features": {}, "factors": {}}
    lr, fm = _models(ctx, k, "max")

    def point(sweep, model, x, data, make):
        def measure():
            r = ours_epochs(ctx, data, make, epochs=cfg["scale_epochs"] + 1, evaluate=False)
            p = {key: r[key] for key in ("epoch_ms", "epoch_ms_list", "first_epoch_ms",
                                         "setup_s", "workers", "n_hot", "gpu_peak_bytes")}
            p.update(nnz=int(data.X.nnz), csr_bytes=csr_bytes(data.X))
            if fl and fl.get("copy_bw"):
                p["floor_ms"] = p["csr_bytes"] / fl["copy_bw"] * 1e3
            return p

        rec = ctx.run(f"{sweep} {model} {x}", measure)
        rec["x"] = x
        out[sweep].setdefault(model, []).append(rec)
        log(f"  {sweep:8s} {model:5s} {x:>12,}: "
            + (f"epoch {rec['epoch_ms']:.3f} ms" if "epoch_ms" in rec else
               (rec.get("error") or rec.get("skipped", ""))[:100]))

    for n in cfg["scale_rows"]:
        data = pool.get("binary", cfg["scale_rows_features"], n, test=False)
        for model, make in (lr, fm):
            point("rows", model, n, data, make)
    for lf in cfg["scale_features"]:
        data = pool.get("binary", lf, cfg["scale_features_rows"], test=False)
        for model, make in (lr, fm):
            point("features", model, 2 ** lf, data, make)
    n, lf = cfg["scale_factors_data"]
    data = pool.get("binary", lf, n, test=False)
    for kk in cfg["scale_factors"]:
        make = _models(ctx, kk, "max")[1][1]
        point("factors", "FM", kk, data, make)
    out["fits"] = report.scaling_fits(out)
    return out


# --------------------------------------------------------------------------
# the command line
# --------------------------------------------------------------------------
def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m benchmarks",
                                 description="sklearn-cuwide against its peers, in one run.")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--gpu", action="store_true", help="the full GPU run (default with a GPU)")
    g.add_argument("--cpu", action="store_true", help="the small CPU variant")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (seconds; the test's)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma list of {', '.join(PARTS)} (env always runs)")
    ap.add_argument("--skip", default="",
                    help=f"comma list of groups to leave out: {', '.join(SKIPPABLE)}")
    ap.add_argument("--datasets", default=None, help="real datasets, comma list (default all)")
    ap.add_argument("--real-max-rows", type=int, default=None,
                    help="cap the train and test rows of each real dataset")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="nothing new starts after this many seconds (default per mode)")
    ap.add_argument("--sk-workers", type=int, default=None,
                    help="processes for the scikit-learn fits (0: in this process)")
    ap.add_argument("--systems-data", default=None,
                    help="synthetic datasets of the systems part, ROWSxLOG2FEATURES,...")
    ap.add_argument("--scale-rows", default=None, help="rows of the rows sweep, comma list")
    ap.add_argument("--merge", default=None, metavar="RESULTS_JSON",
                    help="keep the parts of an earlier results.json that this run does not "
                         "run (a full run split over several calls)")
    ap.add_argument("--torch-grid", choices=sorted(TORCH_GRIDS), default=None,
                    help="the PyTorch baselines' grid, the best test AUC reported (default: "
                         "full on --gpu, small otherwise)")
    args = ap.parse_args(argv)
    args.mode = "gpu" if args.gpu else "cpu" if args.cpu else (
        "gpu" if gpu_available() else "cpu")
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if set(args.parts) - set(PARTS + ("env",)):
        ap.error(f"unknown part(s) {sorted(set(args.parts) - set(PARTS))}; "
                 f"choose from {', '.join(PARTS)}")
    args.skip = [s.strip() for s in args.skip.split(",") if s.strip()]
    if set(args.skip) - set(SKIPPABLE):
        ap.error(f"unknown --skip value(s) {sorted(set(args.skip) - set(SKIPPABLE))}; "
                 f"choose from {', '.join(SKIPPABLE)}")
    if args.datasets:
        args.datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    return args


def plan_data(pool, cfg, parts, skip):
    if "systems" in parts:
        for rows, lf in cfg["systems_data"]:
            pool.plan("binary", lf, rows)
        if "regression" not in skip:
            rows, lf = cfg["systems_data"][0]
            pool.plan("regression", lf, min(rows, cfg["reg_rows"]))
    if "ablation" in parts:
        pool.plan("binary", cfg["ablation_data"][1], cfg["ablation_data"][0])
    if "scaling" in parts:
        for n in cfg["scale_rows"]:
            pool.plan("binary", cfg["scale_rows_features"], n, test=False)
        for lf in cfg["scale_features"]:
            pool.plan("binary", lf, cfg["scale_features_rows"], test=False)
        pool.plan("binary", cfg["scale_factors_data"][1], cfg["scale_factors_data"][0],
                  test=False)


def _notes(cfg, sk_workers):
    return [
        f"Mini-batch systems: batch_size {BATCH}, learning rate {LEARNING_RATE} (adagrad; "
        f"sgd's 'auto' from the data), {cfg['epochs']} epochs on synthetic data, "
        f"{cfg['real_epochs']} on the real datasets; LR C={C_LR}, except our adagrad LR, "
        "whose learning rate and C are tuned as the PyTorch baselines are (its grid is "
        "shown); FM alpha/beta "
        f"{tuple(cfg['fm_l2'])} (synthetic), (3e-4, 3e-4) (real). The rows named 'defaults' fit "
        "the estimators at their default parameters.",
        "ours (epochs): sklearn_cuwide._profiling.time_epochs, the estimator's own fit code "
        "timed per epoch (CUDA events on the GPU); epoch ms is the median of the epochs after "
        "the first (the first holds the concurrency warm-up and any streamed upload); kernels "
        "are compiled in a warm-up before any timing. ours (fit): fit() end to end.",
        f"scikit-learn runs on the CPU on at most {cfg['sk_rows']:,} training rows of the "
        f"synthetic data ({cfg['sgd_rows']:,} for SGDClassifier; all rows of the real datasets)"
        "; our lbfgs runs on the same rows for the fit-time ratio and the coefficients"
        + (f"; the fits ran in {sk_workers} worker process(es) beside the GPU parts, "
           f"on the last {sk_workers} CPU cores with one thread each (the main process on "
           "the others, where there are more), their data read from files written "
           "before the timed work" if sk_workers else "") + ".",
        "x ours: a system's time per row of an epoch over ours (LR: ours LR adagrad; FM: ours FM "
        "adagrad concurrency=max); above 1 is slower than ours.",
        "End to end: fit s is the wall-clock from a scipy CSR in host memory to the fitted "
        "model, every copy included (ours: fit(); PyTorch: the model, the copy of the train "
        "and test CSR to the device and the epochs, the per-epoch evaluation excluded). Time "
        "to target: the setup plus training time at which a system's per-epoch test AUC first "
        "reaches the target, the tuned PyTorch baseline's best test AUC (LR without PyTorch: "
        "scikit-learn LogisticRegression's); ours (epochs) rows time the setup on the wall "
        "clock and the epochs with CUDA events; fit-only rows reach it with their final model "
        "or not at all (inf). x PyTorch: the tuned PyTorch baseline's time over the row's "
        "(above 1: faster than PyTorch).",
        "PyTorch: " + _torch_note(cfg.get("torch_grid")),
        "GPU peak: cupy memory-pool bytes during the run (the layout included); PyTorch: "
        "torch.cuda.max_memory_allocated. cuSPARSE: timed over a capped number of mini-batches "
        "and scaled to an epoch. The PyTorch FM needs fixed-length rows.",
    ]


#: the parts a results.json holds, by key
PART_KEYS = {"floors": ("floors",), "startup": ("startup",), "systems": ("systems",),
             "real": ("real", "real_info"), "ablation": ("ablation",),
             "scaling": ("scaling",)}


def _merge_note(note):
    return note.startswith("Parts ") and note.endswith(", merged.")


def _sources(earlier):
    """``{part: env}`` of an earlier run's results: each part's own run (a
    part it merged in turn keeps that run's environment)."""
    env = earlier.get("env") or {}
    out = {part: env for part in PART_KEYS}
    for src in _as_list(earlier.get("env_merged")):
        own = {k: v for k, v in src.items() if k != "parts"}
        for part in src.get("parts", []):
            out[part] = own
    return out


def _as_list(merged):
    if not merged:
        return []
    return merged if isinstance(merged, list) else [merged]


def merge_results(res, earlier, parts):
    """Into ``res``, the parts of an ``earlier`` run's results that this run
    did not run (their timings and notes with them).  ``env_merged`` lists
    the environments they come from, each with its ``parts`` (a part the
    earlier run had merged keeps the run it came from)."""
    merged = []
    for part, keys in PART_KEYS.items():
        if part in parts or not any(k in earlier for k in keys):
            continue
        for k in keys:
            if k in earlier:
                res[k] = earlier[k]
        if part in earlier.get("timings", {}):
            res["timings"][part] = earlier["timings"][part]
        merged.append(part)
    for k in ("compile_s", "data_generated"):
        res[k] = {**earlier.get(k, {}), **res.get(k, {})}
    # the earlier run's notes of what it merged are written again below
    res["notes"] = res["notes"] + [n for n in earlier.get("notes", [])
                                   if n not in res["notes"] and not _merge_note(n)]
    src = _sources(earlier)
    groups = []  # (env, [parts]) in part order, one per source run
    for part in merged:
        for env, ps in groups:
            if env is src[part]:
                ps.append(part)
                break
        else:
            groups.append((src[part], [part]))
    res["env_merged"] = [dict(env, parts=ps) for env, ps in groups]
    for env, ps in groups:
        res["notes"].append(f"Parts {', '.join(ps)} are those of an earlier run (commit "
                            f"{env.get('git_commit')}, {env.get('date_utc')}), merged.")
    return merged


def _torch_note(grid):
    if not grid:
        return "Adagrad, batch 1024, rate 0.05 (no grid)."
    rates = grid["learning_rates"]
    rates = "; ".join(f"{o} {', '.join(f'{r:g}' for r in rates[o])}" for o in rates) \
        if isinstance(rates, dict) else ", ".join(f"{r:g}" for r in rates)
    on = (f"{grid['tune_rows']:,} rows" if grid.get("tune_rows") else "all rows") + ", " + (
        f"{grid['tune_epochs']} epoch(s)" if grid.get("tune_epochs") else "all epochs")
    return (f"the '{grid.get('name', '?')}' grid per data set: optimizers "
            f"{', '.join(grid['optimizers'])}, batch sizes "
            f"{', '.join(f'{b:,}' for b in grid['batch_sizes'])}, rates {rates}; every setting "
            f"tuned on {on}; the best test AUC (ties within 1e-4: the fastest to it) is "
            "trained again on the whole data set when tuned on less, and that run is reported.")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.mode == "gpu" and not gpu_available():
        print("error: --gpu needs cupy and a usable CUDA GPU; use --cpu", file=sys.stderr)
        return 2
    systems_data = None
    if args.systems_data:
        systems_data = [tuple(int(v) for v in s.lower().split("x"))
                        for s in args.systems_data.split(",") if s.strip()]
    cfg = make_config(
        args.mode, args.smoke, systems_data=systems_data, budget_s=args.budget_s,
        sk_workers=args.sk_workers, real_max_rows=args.real_max_rows,
        scale_rows=[int(float(v)) for v in args.scale_rows.split(",")] if args.scale_rows
        else None, torch_grid=args.torch_grid)
    cfg.update(parts=args.parts, skip=args.skip)
    warnings.simplefilter("ignore")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx = Ctx(args.mode == "gpu", cfg, args.skip)
    res = {"config": cfg, "timings": {}, "notes": []}

    def part(name, fn, *a):
        if name not in ("env", "finish") and name not in args.parts:
            return None
        log(f"\n##### {name} (estimate {cfg['estimates'].get(name, '?')} s; "
            f"{max(ctx.left(), 0):.0f} s of the budget left)")
        t0 = time.perf_counter()
        try:
            r = fn(*a)
        except Exception as exc:  # recorded; the other parts still run
            r = {"error": err_text(exc), "traceback": traceback.format_exc()[-3000:]}
            log(f"  ! part {name} failed: {r['error']}")
        res["timings"][name] = time.perf_counter() - t0
        log(f"##### {name} done in {res['timings'][name]:.1f} s")
        return r

    res["env"] = part("env", part_env, ctx, argv)
    fl = res["floors"] = part("floors", floors, ctx)
    res["startup"] = part("startup", part_startup, ctx)
    fl = None if fl is None or "error" in fl else fl
    pool = DataPool(cfg["test_rows"], log=log)
    plan_data(pool, cfg, args.parts, args.skip)
    jobs = Jobs(cfg["sk_workers"])
    if jobs.error:
        res["notes"].append(f"scikit-learn worker processes unavailable ({jobs.error}); "
                            "ran in-process")
    try:
        res["systems"] = part("systems", part_systems, ctx, pool, jobs, fl)
        real = part("real", part_real, ctx, jobs, fl, args.datasets)
        if real is not None:
            res["real"], res["real_info"] = real if isinstance(real, tuple) else (real, None)
        res["ablation"] = part("ablation", part_ablation, ctx, pool)
        res["scaling"] = part("scaling", part_scaling, ctx, pool, fl)
        part("finish", finish, ctx, res, jobs)
    finally:
        jobs.close(kill=ctx.left() + 30 <= 0)
    for key in ("floors", "startup", "systems", "real", "real_info", "ablation", "scaling"):
        if res.get(key) is None:
            res.pop(key, None)
    res["compile_s"] = ctx.compile_s
    res["data_generated"] = pool.generated
    res["notes"] += ctx.notes + _notes(cfg, cfg["sk_workers"])
    if args.merge:
        merge_results(res, json.loads(Path(args.merge).read_text()), args.parts)
    if "plots" not in args.skip:
        try:
            made = report.make_plots(res, out_dir)
            log(f"\nplots: {', '.join(str(p) for p in made) or 'none (nothing to draw)'}")
        except ImportError as exc:
            res["notes"].append(f"No PNG plots: matplotlib is not installed ({exc}).")
            log(f"\nplots skipped: matplotlib is not installed ({exc})")
        except Exception as exc:
            res["notes"].append(f"The PNG plots failed: {err_text(exc)}.")
            log(f"\nplots not made: {err_text(exc)}")
    res["errors"] = report.collect_errors(res)
    report.write_json(res, out_dir / "results.json")
    report.write_markdown(res, out_dir / "results.md")
    log(f"\nwrote {out_dir / 'results.json'} and {out_dir / 'results.md'} "
        f"({time.perf_counter() - ctx.t0:.0f} s in all)")
    print(report.short_table(res), flush=True)
    return 0
