"""Thread block clusters as workers of the FM's training kernel: epoch time
and test AUC against the cluster size, on the suite's FM task.

    PYTHONPATH=. python benchmarks/explore_cluster.py [--clusters 1,2,4,8]
        [--concurrency max,auto] [--torch] [--penalty] [--torch-lr-seeds 1,2] [--lr-rows 4000000] [--out DIR]

A worker of the CUDA training kernel is ``cluster`` thread blocks that train
one sample block together (``cuda/cuwide_train.cu``): the same sequential
semantics per worker, in about 1/cluster of the time, so that 1/cluster of
the workers fill the GPU and the Hogwild staleness shrinks by that factor.
The task is the suite's (``run_all.py``): 4M Criteo-like rows x 2^22
features, 400k test rows, FM k=16 with Adagrad lr 0.05, alpha/beta
1e-7/1e-6, batch 1024, 3 epochs; ``--torch`` adds the PyTorch FM of the same
task (the suite's baseline) for the AUC it has to beat.
"""

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run_all as ra  # noqa: E402


_VARIANT_CACHE = {}


def use_sources(ctx, spec):
    """Compile the kernels from another source folder, with extra macros
    (``name=DIR[+MACRO=V...]``): the A/B of a kernel change in one process.
    A ``+staleness=POLICY`` token is no macro: the variant's runs take that
    step policy (``none`` for plain lock-free sums); returns the runs' extra
    ``run_epoch`` options."""
    from sklearn_cuwide import _kernels

    name, _, rest = spec.partition("=")
    folder, *macros = rest.split("+")
    opts = {}
    for m in [m for m in macros if m.startswith("staleness=")]:
        pol = m.partition("=")[2]
        opts["staleness"] = {"none": False, "full": True}.get(pol, pol)
        macros.remove(m)
    d = Path(folder).resolve()
    if not (d / "cuwide_common.cuh").is_file():
        raise SystemExit(f"variant {name}: no kernel sources in {d}")
    _kernels.source_dir = lambda: d
    _kernels.NVRTC_OPTIONS = ("-std=c++17",) + tuple(f"-D{m}" for m in macros)
    # each variant keeps its compiled kernels (and warm-up) for the next round
    _kernels._CACHE = _VARIANT_CACHE.setdefault(spec, ({}, set()))[0]
    ctx.warmed = _VARIANT_CACHE[spec][1]
    print(f"variant {name}: {d} {' '.join(macros)} {opts or ''}", flush=True)
    return opts


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--clusters", default="1,2,4,8")
    ap.add_argument("--concurrency", default="max,auto")
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--torch", action="store_true")
    ap.add_argument("--torch-seeds", default="0", help="seeds of the --torch runs")
    ap.add_argument("--lr-too", action="store_true", help="also LR adagrad per cluster")
    ap.add_argument("--fm-runs", default="",
                    help="FM16 runs as cluster:workers:staleness[:g], comma separated "
                         "(staleness: cap-auto, capC, sqrt, none; g: per-sample "
                         "accumulators in global memory; s: scale_penalty)")
    ap.add_argument("--seeds", default="0",
                    help="seeds of the --fm-runs (the layout's shuffle and the model's "
                         "initialisation), comma separated: the run-to-run spread")
    ap.add_argument("--lr-grids", default="",
                    help="LR adagrad (cluster 1) with these many blocks, e.g. 244,264")
    ap.add_argument("--penalty", action="store_true",
                    help="the suite's LR adagrad (concurrency=auto) and FM16 adagrad "
                         "(concurrency=max) rows with the lazy and the scaled penalty, per "
                         "seed of --seeds: the scaling's cost per epoch and AUC side by side")
    ap.add_argument("--plain-too", action="store_true",
                    help="each --penalty row also with the apply's nonzeros read as plain "
                         "loads (skip bit 16) instead of streaming ones, run right after it")
    ap.add_argument("--torch-lr-seeds", default="",
                    help="seeds of PyTorch LR runs (the suite's LR baseline), comma separated")
    ap.add_argument("--variants", default="",
                    help="A/B of kernel sources: name=DIR[+MACRO=V...], comma separated "
                         "(DIR holds the .cu/.cuh files; the macros go to NVRTC as -D), "
                         "each running the suite's LR row and/or FM16's (--variant-models) "
                         "per seed of --seeds, alternating, --variant-rounds times")
    ap.add_argument("--variant-rounds", type=int, default=2)
    ap.add_argument("--no-variant-check", action="store_true",
                    help="skip the check before the variants' timed runs: one epoch of one "
                         "worker, strictly in order, from a fresh model, its training loss "
                         "against the first variant's (a broken variant shows there)")
    ap.add_argument("--lr-staleness", default="",
                    help="the suite's LR adagrad row (concurrency=auto) with these step "
                         "policies under concurrency (none, sqrt, full, cap-auto, capC), "
                         "comma separated, per seed of --seeds")
    ap.add_argument("--variant-models", default="lr",
                    help="lr, fm or lr,fm: the suite's LR adagrad row (concurrency=auto) "
                         "and its FM16 row (concurrency=max, scale_penalty)")
    ap.add_argument("--out", default="benchmarks/results/device/explore_cluster")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    args = ra.parse_args(["--gpu", "--parts", "systems", "--budget-s", "100000"])
    cfg = ra.make_config(args)
    ctx = ra.Ctx(True, cfg, args)
    pool = ra.DataPool(cfg["test_rows"])
    pool.plan("binary", 22, a.rows, test=True)
    t0 = time.perf_counter()
    data = pool.get("binary", 22, a.rows, test=True)
    print(f"data {data.key}: {time.perf_counter() - t0:.1f} s", flush=True)
    fa, fb = cfg["fm_l2"]
    rows = []

    def dump():  # after every run: a call cut short keeps what it measured
        (out / "explore_cluster.json").write_text(json.dumps(rows, indent=1, default=str))

    def show(tag, r):
        aucs = [c.get("test_auc") for c in r["curve"]]
        print(f"{tag:28s} epoch {r['epoch_ms']:9.3f} ms  first {r['first_epoch_ms']:9.1f} ms  "
              f"workers {r.get('blocks', '-')}  AUC/epoch "
              + " ".join(f"{x:.4f}" for x in aucs if x is not None) + "  logloss/epoch "
              + " ".join(f"{c['test_logloss']:.4f}" for c in r["curve"]
                         if c.get("test_logloss") is not None), flush=True)
        rows.append(dict(tag=tag, epoch_ms=r["epoch_ms"], epoch_ms_list=r["epoch_ms_list"],
                         first_epoch_ms=r["first_epoch_ms"], workers=r.get("blocks"),
                         cluster=r.get("cluster"), concurrency=r.get("concurrency"),
                         curve=r["curve"], test_auc=r.get("test_auc"),
                         test_logloss=r.get("test_logloss")))
        dump()

    seeds = [int(x) for x in a.seeds.split(",") if x]

    def penalty(k):  # the suite's: alpha / beta for the FM, C for LR
        return dict(l2_w=fa, l2_v=fb) if k else dict(l2_w=1.0 / (ra.C_LR * data.n))

    def run(tag, k, **kw):
        """One run_kernel row; None (and the error printed) when it fails:
        the other rows still tell."""
        try:
            r = ra.run_kernel(ctx, data, k=k, **{"epochs": a.epochs, **penalty(k), **kw})
        except Exception as exc:
            print(f"{tag}: ERROR {ra._err(exc)}", flush=True)
            return None
        if kw.get("evaluate", True):
            show(tag, r)
        return r

    for cl in [int(c) for c in a.clusters.split(",") if c]:
        for conc in a.concurrency.split(","):
            conc = conc if conc in ("max", "auto") else int(conc)
            run(f"FM16 cluster={cl} conc={conc}", 16, concurrency=conc, opts={"cluster": cl})
        if a.lr_too:
            run(f"LR cluster={cl} conc=auto", 0, concurrency="auto", opts={"cluster": cl})
    for spec in [x for x in a.fm_runs.split(",") if x]:
        parts = spec.split(":")
        cl, grid, stale = int(parts[0]), int(parts[1]), parts[2]
        opts = {"cluster": cl, "grid": grid,
                "staleness": False if stale == "none" else stale}
        flags = parts[3] if len(parts) > 3 else ""
        if "g" in flags:
            opts["acc_global"] = True
        for seed in seeds:
            run(f"FM16 {spec}" + (f" seed={seed}" if seed else ""), 16, seed=seed, opts=opts,
                scale_penalty="s" in flags)
    for grid in [int(g) for g in a.lr_grids.split(",") if g]:
        run(f"LR grid={grid}", 0, epochs=a.epochs + 2, opts={"grid": grid})
    for seed in seeds if a.penalty else ():
        for k, conc in ((0, "auto"), (16, "max")):
            for scaled in (False, True):
                for plain in (False, True) if a.plain_too else (False,):
                    tag = (f"{'FM16' if k else 'LR'} {'scaled' if scaled else 'lazy'} "
                           f"seed={seed}" + (" plain-loads" if plain else ""))
                    run(tag, k, concurrency=conc, seed=seed, scale_penalty=scaled,
                        opts={"skip": 16} if plain else None)
    for stale in [x for x in a.lr_staleness.split(",") if x]:
        pol = {"none": False, "full": True}.get(stale, stale)
        for seed in seeds:
            run(f"LR staleness={stale} seed={seed}", 0, seed=seed, concurrency="auto",
                opts={"staleness": pol})
    variants = [v for v in a.variants.split(",") if v]
    models = [{"lr": 0, "fm": 16}[m] for m in a.variant_models.split(",")]
    first = {}
    for spec in () if a.no_variant_check else variants:
        use_sources(ctx, spec)  # in order: no step policy applies
        for k in models:
            tag = f"{'FM16' if k else 'LR'} {spec.split('=')[0]}"
            r = run(tag + " check", k, epochs=1, evaluate=False,
                    scale_penalty=bool(k) or None, opts={"deterministic": True})
            if r is None:
                continue
            loss = r["train_loss"][0]
            rel = abs(loss - first.setdefault(k, loss)) / abs(first[k])
            print(f"{tag:28s} in-order epoch's training loss {loss:.9g} (relative difference "
                  f"to the first variant {rel:.1e}{', OVER 1e-4' if rel > 1e-4 else ''})",
                  flush=True)
            rows.append(dict(tag=tag + " check", ordered_loss=loss, relative_difference=rel))
            dump()
    for rnd in range(a.variant_rounds if variants else 0):
        for spec in variants:
            vopts = use_sources(ctx, spec)
            for seed in seeds:
                for k in models:
                    run(f"{'FM16' if k else 'LR'} {spec.split('=')[0]} seed={seed} round={rnd}",
                        k, seed=seed, concurrency="max" if k else "auto",
                        scale_penalty=bool(k) or None, opts=vopts or None)
    torch_runs = [(0, seed) for seed in a.torch_lr_seeds.split(",") if seed]
    if a.torch:
        torch_runs += [(16, seed) for seed in a.torch_seeds.split(",") if seed]
    for k, seed in torch_runs:
        r = ra.run_torch(ctx, data, k=k, epochs=a.epochs, seed=int(seed))
        aucs = [c.get("test_auc") for c in r.get("curve", [])]
        tag = f"PyTorch {'FM16' if k else 'LR'}" + (f" seed={seed}" if int(seed) else "")
        print(f"{tag:28s} epoch {r.get('epoch_ms', float('nan')):9.1f} ms  AUC/epoch "
              + " ".join(f"{x:.4f}" for x in aucs if x is not None), flush=True)
        rows.append(dict(tag=tag, epoch_ms=r.get("epoch_ms"),
                         test_auc=r.get("test_auc"), curve=r.get("curve")))
        dump()
    dump()


if __name__ == "__main__":
    main()
