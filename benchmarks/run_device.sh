#!/usr/bin/env bash
# Everything that needs the GPU, in one call on the device machine, from the
# source tree:  bash benchmarks/run_device.sh [tests|bench|all]
#   tests:    the gpu-marked tests and the demo on the GPU
#   sanitize: compute-sanitizer memcheck and racecheck over the kernel tests
#             (sanitize-lbfgs: only the L-BFGS kernels' tests)
#   bench:    benchmarks/bench_gpu.py (issue-3 targets)
#   suite:    benchmarks/run_all.py --gpu (issue 4; carry the real data as .data)
#   systems:  only the suite's floors, systems and real-data parts (~5 minutes)
#   packed:   the kernel tests, memcheck and racecheck of the scaled
#             configurations, and LR/FM lazy vs scaled over 3 seeds (~4 minutes)
#   ab, ab-full: a kernel change (ab-full: every gpu test, and racecheck -k "$RK"): the kernel tests, memcheck, then the A/B of
#             kernel sources in VARIANTS (explore_cluster.py --variants; the
#             old sources copied to an untracked folder) and the LR stage times
#   lr-cap:   branch lr-cap-auto: the kernel tests, memcheck, and LR adagrad
#             with the step policies none / cap-step / cap-auto over 3 seeds
#             (epoch time, AUC and logloss per epoch; ~4 minutes)
#   profile:  Nsight Compute (--set full) on one resident epoch of the suite's
#             LR and FM16 rows (benchmarks/profile_epoch.py; PROFILE_MODELS)
#   scaling-large: the rows sweep from 1M to 64M rows (points above 16M repeat
#             the generated rows; timing only), merged into suite/ afterwards
#   scaling-xl: only the rows points past 64M (SCALE_ROWS, default 128M), to be
#             merged into suite/ with merge_results.py --add-points
# Logs and results go to $OUT (the device tool's folder) or benchmarks/results/device.
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-benchmarks/results/device}
mkdir -p "$OUT"
what=${1:-all}
# the real data sets carried as .data reach every step, the gpu tests included
[[ -d .data ]] && export SKLEARN_CUWIDE_DATA=${SKLEARN_CUWIDE_DATA:-$PWD/.data}
summary=()
step() {  # name, command...
  local name=$1; shift
  local t0=$SECONDS
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-12s rc=%-3s %4ss  %s' "$name" "$rc" "$((SECONDS - t0))" "$(tail -n 1 "$OUT/$name.log" | cut -c1-90)")")
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt"
if [[ $what == tests* || $what == all ]]; then
  step gpu_tests python -m pytest -q -p no:cacheprovider -m gpu tests
  step demo python -m sklearn_cuwide.demo --n-samples 400000
fi
if [[ $what == *sanitize* || $what == all ]]; then
  K='epoch_matches_reference or all_hot or classic or (predict_kernel and int32 and float32) or fused or memory_kernels or (cluster and (fm8 or lr-adagrad or mlr or edge))'
  [[ $what == *sanitize-lbfgs* ]] && K='fused or memory_kernels'
  step memcheck compute-sanitizer --tool memcheck --error-exitcode 9 \
    python -m pytest -q -p no:cacheprovider -x tests/test_gpu_kernels.py -k "$K"
  step racecheck compute-sanitizer --tool racecheck --error-exitcode 9 \
    python -m pytest -q -p no:cacheprovider -x tests/test_gpu_kernels.py -k "${RK:-epoch_matches_reference or all_hot or fused or memory_kernels or (cluster_epoch and (lr-adagrad or fm8 or mlr))}"
fi
if [[ $what == *bench* || $what == all ]]; then
  step bench_gpu python benchmarks/bench_gpu.py --out "$OUT/bench_gpu"
fi
if [[ $what == *suite* || $what == all ]]; then
  export SKLEARN_CUWIDE_DATA=${SKLEARN_CUWIDE_DATA:-$PWD/.data}
  step suite python benchmarks/run_all.py --gpu --budget-s "${SUITE_BUDGET_S:-250}" \
    --parts "${SUITE_PARTS:-floors,systems,real,ablation,scaling}" --out "$OUT/suite"
fi
if [[ $what == *systems* ]]; then
  export SKLEARN_CUWIDE_DATA=${SKLEARN_CUWIDE_DATA:-$PWD/.data}
  step systems python benchmarks/run_all.py --gpu --budget-s "${SUITE_BUDGET_S:-240}" \
    --parts floors,systems,real --out "$OUT/suite"
fi
if [[ $what == *packed* ]]; then
  step kernel_tests python -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_kernels.py
  step memcheck compute-sanitizer --tool memcheck --error-exitcode 9 \
    python -m pytest -q -p no:cacheprovider -x tests/test_gpu_kernels.py -k "scaled"
  step racecheck compute-sanitizer --tool racecheck --error-exitcode 9 \
    python -m pytest -q -p no:cacheprovider -x tests/test_gpu_kernels.py \
    -k "scaled and (epoch_matches_reference or packed)"
  step penalty python benchmarks/explore_cluster.py --clusters "" --penalty --seeds 0,1,2 \
    --out "$OUT/penalty"
fi
if [[ $what == ab* ]]; then
  if [[ $what == ab-full ]]; then  # every gpu test, and racecheck (RK) too
    step gpu_tests python -m pytest -q -p no:cacheprovider -m gpu tests
  else
    step kernel_tests python -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_kernels.py
  fi
  step ab python benchmarks/explore_cluster.py --clusters "" --variants "$VARIANTS" \
    --seeds "${SEEDS:-0}" --variant-rounds "${ROUNDS:-2}" --variant-models "${MODELS:-lr}" \
    --out "$OUT/ab"
  K='epoch_matches_reference or all_hot or classic or fused or (cluster and (fm8 or lr-adagrad or mlr or edge))'
  step memcheck compute-sanitizer --tool memcheck --error-exitcode 9 \
    python -m pytest -q -p no:cacheprovider -x tests/test_gpu_kernels.py -k "$K"
  [[ $what == ab-full ]] && step racecheck compute-sanitizer --tool racecheck --error-exitcode 9 \
    python -m pytest -q -p no:cacheprovider -x tests/test_gpu_kernels.py -k "$RK"
  [[ -n ${STAGES-LR} ]] && step stages python benchmarks/explore_gpu.py --models "${STAGES-LR}" \
    --no-quality --out "$OUT/stages"
fi
if [[ $what == lr-cap ]]; then
  step kernel_tests python -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_kernels.py
  step memcheck compute-sanitizer --tool memcheck --error-exitcode 9 \
    python -m pytest -q -p no:cacheprovider -x tests/test_gpu_kernels.py \
    -k "concurrency_scale or hogwild or epoch_matches_reference"
  step staleness python benchmarks/explore_cluster.py --clusters "" \
    --lr-staleness none,cap-step,cap-auto --seeds 0,1,2 --out "$OUT/staleness"
fi
if [[ $what == profile ]]; then
  for m in ${PROFILE_MODELS:-lr fm}; do
    step "ncu_$m" ncu --profile-from-start off --clock-control none --set full \
      -o "$OUT/ncu_$m" -f python benchmarks/profile_epoch.py --model "$m"
    ncu --import "$OUT/ncu_$m.ncu-rep" --page details > "$OUT/ncu_$m.txt" 2>&1
  done
fi
if [[ $what == *scaling-large* ]]; then
  step scaling_large python benchmarks/run_all.py --gpu --parts floors,scaling \
    --scale-rows "${SCALE_ROWS:-1e6,2e6,4e6,8e6,16e6,32e6,64e6}" --scale-sweeps rows \
    --scale-rows-base "${SCALE_ROWS_BASE:-16e6}" --budget-s "${SUITE_BUDGET_S:-450}" \
    --out "$OUT/scaling_large"
fi
if [[ $what == *scaling-xl* ]]; then
  step scaling_xl python benchmarks/run_all.py --gpu --parts floors,scaling \
    --scale-rows "${SCALE_ROWS:-128e6}" --scale-sweeps rows \
    --scale-rows-base "${SCALE_ROWS_BASE:-16e6}" --budget-s "${SUITE_BUDGET_S:-520}" \
    --out "$OUT/scaling_xl"
fi
echo
cat "$OUT/gpu.txt"
printf '%s\n' "${summary[@]}"
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$OUT"/memcheck.log "$OUT"/racecheck.log 2>/dev/null
[[ -f "$OUT/bench_gpu/results.md" ]] && cat "$OUT/bench_gpu/results.md"
exit 0
