#!/usr/bin/env bash
# Everything that needs the GPU, from the repository root, in one device call:
#   bash benchmarks/device.sh [STEP ...]    steps: checks tests memcheck racecheck demo bench
#                                           bench-more startup ooc (default: checks demo bench
#                                           bench-more; each call at most 10 minutes: see
#                                           benchmarks/README.md for how to split them)
# "checks" is tests, memcheck and racecheck side by side: the GPU tests in
# SHARDS processes (test files dealt round-robin), racecheck in two, memcheck
# after the tests (one after another they took 5, 4 and 0.2 minutes).
# Each step logs to $OUT/STEP.log (OUT: the device tool's folder, else
# /tmp/cuwide-device); a summary table is printed last.  The device tool
# brings back at most 8 files of $OUT: run bench (five files of results and
# its log) in a call of its own, not after checks (five logs).  The real
# datasets, carried as the ignored folder .data, reach every step.  A copy of
# the tree whose .git is stale gives the commit as BENCH_COMMIT (in the results).
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/cuwide-device}
mkdir -p "$OUT"
[[ -d .data ]] && export SKLEARN_CUWIDE_DATA=${SKLEARN_CUWIDE_DATA:-$PWD/.data}
# the kernel tests each sanitizer runs (every kernel and thread-block-cluster configuration
# once; the MCMC block kernel's are in tests/test_mcmc.py)
MEMCHECK_K='epoch_matches_reference or row_order_kernel or in_order_kernel or concurrency_scale or all_hot or classic or packed_penalty or switches_match or ablation_entry or (predict_kernel and int32 and float32) or fused or memory_kernels or row_kernels or build_kernels or loss_kernel or factors_kernel or (cluster and (fm8 or lr-adagrad or mlr or edge))'
RACECHECK_K1='(epoch_matches_reference and one_block) or (in_order_kernel and fm8) or all_hot or ablation_entry'
RACECHECK_K2='fused or memory_kernels or row_kernels or build_kernels or loss_kernel or block_kernel or (cluster_epoch and (lr-adagrad or fm8 or mlr))'
SHARDS=${SHARDS:-3}
PYTEST="python -m pytest -q -p no:cacheprovider"
summary=()
step() {  # name, command...
  local name=$1 t0=$SECONDS rc
  shift
  "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  summary+=("$(printf '%-10s rc=%-3s %5ss  %s' "$name" "$rc" "$((SECONDS - t0))" \
    "$(grep -h 'passed\|failed\|ERROR SUMMARY\|RACECHECK SUMMARY\|errors recorded' "$OUT/$name.log" | tail -n 1 | cut -c1-100)")")
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1
parallel() {  # command lines, each run in its own process; fails if one fails
  local pids=() rc=0 p
  for c in "$@"; do bash -c "$c" & pids+=($!); done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}
gpu_tests() {  # the gpu-marked tests in SHARDS processes; their logs, then the totals
  local files=(tests/test_*.py) cmds=() k i rc
  for ((k = 0; k < SHARDS; k++)); do
    local mine=""
    for ((i = k; i < ${#files[@]}; i += SHARDS)); do mine+=" ${files[i]}"; done
    cmds+=("$PYTEST -m gpu $mine > $OUT/tests.$k.log 2>&1")
  done
  parallel "${cmds[@]}"; rc=$?
  cat "$OUT"/tests.[0-9]*.log
  for ((k = 0; k < SHARDS; k++)); do
    grep -h 'passed\|failed\|skipped' "$OUT/tests.$k.log" | tail -n 1
  done | awk '{for (i = 2; i <= NF; i++) if ($i ~ /^(passed|failed|error|errors|xfailed|xpassed|skipped)/) {
      w = $i; sub(/[,;]$/, "", w); n[w] += $(i - 1)} }
    END {for (w in n) printf "%d %s, ", n[w], w; print "in " SHARDS " shards"}' SHARDS="$SHARDS"
  return $rc
}
race() {
  parallel "compute-sanitizer --tool racecheck --error-exitcode 9 $PYTEST -x \
      tests/test_gpu_kernels.py -k '$RACECHECK_K1'" \
    "compute-sanitizer --tool racecheck --error-exitcode 9 $PYTEST -x \
      tests/test_gpu_kernels.py tests/test_mcmc.py -k '$RACECHECK_K2'"
}
for s in ${*:-checks demo bench bench-more}; do
  case $s in
    checks)
      race > "$OUT/racecheck.log" 2>&1 &
      pid=$!; t0=$SECONDS
      step tests gpu_tests
      step memcheck compute-sanitizer --tool memcheck --error-exitcode 9 \
        $PYTEST -x tests/test_gpu_kernels.py tests/test_mcmc.py -k "$MEMCHECK_K"
      wait $pid; rc=$?
      summary+=("$(printf '%-10s rc=%-3s %5ss  %s' racecheck "$rc" "$((SECONDS - t0))" \
        "$(grep -h 'RACECHECK SUMMARY' "$OUT/racecheck.log" | sort | uniq -c | tr -s ' ' | cut -c1-100)")") ;;
    tests) step tests gpu_tests ;;
    memcheck) step memcheck compute-sanitizer --tool memcheck --error-exitcode 9 \
        $PYTEST -x tests/test_gpu_kernels.py tests/test_mcmc.py -k "$MEMCHECK_K" ;;
    racecheck) step racecheck race ;;
    demo) step demo python -m sklearn_cuwide.demo --n-samples 400000 ;;
    # the harness in two calls: floors, start-up and the systems (about 8
    # minutes), then the real datasets, the ablation and the scaling merged
    # into the first call's results, copied to benchmarks/results/ (about 5)
    bench) step bench python -m benchmarks --gpu --parts floors,startup,systems \
        --out "$OUT/results" ;;
    bench-more) step bench-more python -m benchmarks --gpu --parts real,ablation,scaling \
        --merge benchmarks/results/results.json --out "$OUT/results" ;;
    startup) step startup python -m benchmarks --gpu --parts startup --out "$OUT/startup" ;;
    ooc) step ooc python -m benchmarks.out_of_core --out "$OUT/ooc" ;;
    *) echo "unknown step $s (checks tests memcheck racecheck demo bench bench-more startup ooc)" >&2 ;;
  esac
done
for log in bench bench-more startup ooc; do
  [[ -f "$OUT/$log.log" ]] && sed -n '/^wrote /,$p' "$OUT/$log.log"
done
echo
cat "$OUT/gpu.txt"
printf '%s\n' "${summary[@]}"
