"""Sizes, settings and time budgets of the three run modes.

``--gpu``: the comparison on the GPU machine; ``--cpu``: a small variant for a
2-core CPU (GPU-only systems are recorded as not available); ``--smoke``:
tiny sizes, seconds (what ``tests/test_benchmarks.py`` runs).
"""

PARTS = ("floors", "startup", "systems", "real", "ablation", "scaling")
#: groups of systems ``--skip`` can leave out
SKIPPABLE = ("kernel", "estimators", "defaults", "lbfgs", "sgd", "sklearn", "torch",
             "cusparse", "classic", "regression", "plots", "cupy")

# the settings every system shares (the peers get the same ones)
BATCH = 1024
LEARNING_RATE = 0.05  # adagrad; sgd's comes from the data ("auto")
REG_LEARNING_RATE = 0.02  # the FM regressor's
# the MCMC regressor's sweeps on the real regression sets (MovieLens-100k:
# 0.906-0.910 from 400, docs/design/defaults.rst)
MCMC_SWEEPS = 400
INIT_SCALE = 0.01
C_LR = 0.1  # inverse L2 strength of every logistic regression (scikit-learn's C)
# lbfgs (ours and scikit-learn's) converged, not capped, on the Criteo-like data
LBFGS_TOL = 1e-5
LBFGS_MAX_ITER = 300
RIDGE_ALPHA = 1.0
REAL_FM_L2 = (3e-4, 3e-4)
WARM_ROWS = 4096  # rows of the warm-up fits that compile the kernels before timing
FIT_REPEATS = 3  # end-to-end fits of each of our systems on the GPU (median reported)
PREDICT_ROWS = 500_000  # test rows a prediction is timed on (issue target: <= 30 ms)

#: the PyTorch baselines' grids (``--torch-grid``): every optimiser x batch
#: size x learning rate is trained on ``tune_rows`` rows (None: all) for
#: ``tune_epochs`` epochs (None: the run's), the best by test AUC (then by the
#: time to it) is kept, and, when it was tuned on less, trained again on the
#: whole data set: that run is the one reported and compared with.  The rates
#: are per optimiser (Adam's steps are not Adagrad's).
TORCH_GRIDS = {
    "full": {
        "optimizers": ("adagrad", "adam"),
        "batch_sizes": (1024, 4096, 65536),
        "learning_rates": {"adagrad": (0.02, 0.05, 0.2, 0.5),
                           "adam": (0.001, 0.003, 0.01, 0.03)},
        "tune_rows": 500_000,
        "tune_epochs": 1,
    },
    "small": {
        "optimizers": ("adagrad", "adam"),
        "batch_sizes": (1024,),
        "learning_rates": {"adagrad": (0.05,), "adam": (0.003,)},
        "tune_rows": None,
        "tune_epochs": None,
    },
}
#: our adagrad logistic regression's grids, tuned as the PyTorch baselines
#: are (the same run's grid name, tuning rows and epochs, best test AUC):
#: learning rate x ``C``.  PyTorch's models have no penalty; ours have one,
#: and its strength is part of the setting a user would tune.
LR_GRIDS = {
    "full": {"learning_rates": (0.02, 0.05, 0.1, 0.2), "C": (0.01, 0.03, 0.1, 1.0)},
    "small": {"learning_rates": (LEARNING_RATE,), "C": (C_LR,)},
}
#: AUC differences below this are ties (the grid then prefers the faster)
AUC_TIE = 1e-4

#: the start-up part: rows of the fitted data, and the models (ids of
#: ``benchmarks.startup.MODELS``)
STARTUP_ROWS = {"gpu": 20_000, "cpu": 20_000, "smoke": 2_000}
STARTUP_MODELS = {"gpu": ("lr", "fm16"), "cpu": ("lr", "fm16"), "smoke": ("lr",)}

CONFIGS = {
    "gpu": dict(
        systems_data=[(4_000_000, 22)],
        test_rows=PREDICT_ROWS,
        n_factors=16,
        epochs=3,
        sk_rows=250_000,  # LogisticRegression (and our lbfgs beside it), Ridge
        sgd_rows=1_000_000,  # SGDClassifier
        reg_rows=1_000_000,
        cusparse_batches=400,
        real_epochs=10,
        real_max_rows=None,
        real_datasets=None,
        ablation_data=(4_000_000, 22),
        scale_rows=[1_000_000, 2_000_000, 4_000_000, 8_000_000, 16_000_000],
        scale_rows_features=22,
        scale_features=[20, 22, 24, 26],
        scale_features_rows=1_000_000,
        scale_factors=[4, 16, 64, 128],
        scale_factors_data=(1_000_000, 22),
        scale_epochs=3,
        fm_l2=(1e-7, 1e-6),
        budget_s=450.0,
        sk_workers=3,
        torch_grid="full",
        estimates={"env": 3, "floors": 8, "startup": 60, "systems": 360, "real": 60,
                   "ablation": 40, "scaling": 160, "finish": 10},
    ),
    "cpu": dict(
        systems_data=[(100_000, 18)],
        test_rows=20_000,
        n_factors=16,
        epochs=3,
        sk_rows=100_000,
        sgd_rows=100_000,
        reg_rows=50_000,
        cusparse_batches=50,
        real_epochs=5,
        real_max_rows=None,
        real_datasets=None,
        ablation_data=(50_000, 18),
        scale_rows=[50_000, 100_000, 200_000],
        scale_rows_features=18,
        scale_features=[16, 18, 20],
        scale_features_rows=50_000,
        scale_factors=[4, 16, 64],
        scale_factors_data=(50_000, 18),
        scale_epochs=2,
        fm_l2=(3e-4, 3e-4),
        budget_s=1800.0,
        sk_workers=0,
        torch_grid="small",
        estimates={"env": 1, "floors": 2, "startup": 20, "systems": 120, "real": 60,
                   "ablation": 10, "scaling": 60, "finish": 5},
    ),
    "smoke": dict(
        systems_data=[(4_000, 12)],
        test_rows=1_000,
        n_factors=4,
        epochs=2,
        sk_rows=3_000,
        sgd_rows=3_000,
        reg_rows=2_000,
        cusparse_batches=3,
        real_epochs=2,
        real_max_rows=2_000,
        real_datasets=["criteo_xlearn_ffm", "movielens_100k"],
        ablation_data=(3_000, 12),
        scale_rows=[1_000, 2_000, 4_000],
        scale_rows_features=12,
        scale_features=[10, 12],
        scale_features_rows=2_000,
        scale_factors=[2, 4],
        scale_factors_data=(2_000, 12),
        scale_epochs=1,
        fm_l2=(3e-4, 3e-4),
        budget_s=600.0,
        sk_workers=0,
        torch_grid="small",
        estimates={"env": 1, "floors": 1, "startup": 10, "systems": 10, "real": 5,
                   "ablation": 2, "scaling": 5, "finish": 2},
    ),
}


def make_config(mode, smoke=False, **overrides):
    """The settings of a run: the mode's (``smoke``: the tiny ones), then
    the command line's overrides (None leaves a setting as it is)."""
    cfg = dict(CONFIGS["smoke" if smoke else mode])
    cfg.update({k: v for k, v in overrides.items() if v is not None})
    cfg.update(mode=mode, smoke=bool(smoke), batch_size=BATCH, learning_rate=LEARNING_RATE,
               C=C_LR, lbfgs_tol=LBFGS_TOL, lbfgs_max_iter=LBFGS_MAX_ITER,
               startup_rows=STARTUP_ROWS["smoke" if smoke else mode],
               startup_models=STARTUP_MODELS["smoke" if smoke else mode])
    if isinstance(cfg.get("torch_grid"), str):
        cfg["torch_grid"] = dict(TORCH_GRIDS[cfg["torch_grid"]], name=cfg["torch_grid"])
    cfg.setdefault("lr_grid", LR_GRIDS[(cfg.get("torch_grid") or {}).get("name", "small")])
    return cfg
