#!/usr/bin/env bash
# One command for the GPU machine: build (or take prebuilt binaries), run every `cuda` test,
# a compute-sanitizer memcheck pass on small shapes, the benchmark and the per-kernel timings;
# print a summary table.
#
#   tools/gpu/check.sh                      # build in build-gpu/ (needs the dev packages), then check
#   tools/gpu/check.sh --prebuilt DIR       # DIR holds gptoss, test_cuda_kernels, test_cuda_model,
#                                           # lib/ (shared libraries to preload) and data/tiny-gptoss
# Options: --quick (fewer bench sizes/runs), --no-bench, --no-sanitizer, --bench-only.
# Logs and JSON go to $OUT (the device tool's output folder) or ./gpu-check-out.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
prebuilt="" quick=0 bench=1 san=1 tests=1
while [ $# -gt 0 ]; do
  case $1 in
    --prebuilt) prebuilt=$2; shift ;;
    --quick) quick=1 ;;
    --no-bench) bench=0 ;;
    --no-sanitizer) san=0 ;;
    --bench-only) tests=0; san=0 ;;
    *) echo "unknown option $1"; exit 2 ;;
  esac
  shift
done
out=${OUT:-$root/gpu-check-out}
mkdir -p "$out"
if [ -n "$prebuilt" ]; then
  bin=$(cd "$prebuilt" && pwd)
  export LD_LIBRARY_PATH="$bin/lib:${LD_LIBRARY_PATH:-}"
  export GPTOSS_TEST_DATA_DIR="$bin/data"
  gptoss=$bin/gptoss; tk=$bin/test_cuda_kernels; tm=$bin/test_cuda_model; ts=$bin/test_cuda_spec
else
  cmake -S "$root" -B "$root/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release >"$out/cmake.log" 2>&1 &&
    ninja -C "$root/build-gpu" gptoss test_cuda_kernels test_cuda_model test_cuda_spec >"$out/build.log" 2>&1 ||
    { echo "build failed: see $out/build.log"; tail -30 "$out/build.log"; exit 1; }
  gptoss=$root/build-gpu/gptoss; tk=$root/build-gpu/tests/cuda/test_cuda_kernels; tm=$root/build-gpu/tests/cuda/test_cuda_model
  ts=$root/build-gpu/tests/cuda/test_cuda_spec
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
declare -a summary
status() { summary+=("| $1 | $2 |"); }
if [ $tests = 1 ]; then
  # test_cuda_kernels in two halves (attention's and the rest), each under its own limit: the
  # whole suite runs ~7 minutes on an H200. The opt-in warp-specialized expert GEMM's tests run in
  # a process of their own: a kernel that faults poisons its context for every test after it.
  for part in "$tk|-Kernels.Attention*:Kernels.Flash*:Kernels.*WarpSpecialized*|kernels" \
              "$tk|Kernels.Attention*:Kernels.Flash*|attention" "$tk|Kernels.*WarpSpecialized*|warp_specialized" \
              "$tm|*|" "$ts|*|"; do
    IFS='|' read -r t filter half <<<"$part"
    name=$(basename "$t")${half:+_$half}
    [ -x "$t" ] || { status "$name" "not built"; continue; }
    timeout 420 "$t" --gtest_color=no --gtest_filter="$filter" >"$out/$name.log" 2>&1
    rc=$?
    grep -E "rel err|greedy|K=|FAILED|Failure|error" "$out/$name.log" | head -60
    status "$name" "$( [ $rc = 0 ] && echo "PASS ($(grep -c '^\[       OK' "$out/$name.log") tests)" || echo "FAIL rc=$rc")"
  done
fi
if [ $san = 1 ]; then
  GPTOSS_TEST_SMALL=1 timeout 400 compute-sanitizer --tool memcheck --error-exitcode 9 "$tk" --gtest_color=no \
    --gtest_filter='-Kernels.*WarpSpecialized*' >"$out/memcheck.log" 2>&1
  rc=$?
  tail -5 "$out/memcheck.log"
  status "compute-sanitizer memcheck (test_cuda_kernels, small shapes)" "$( [ $rc = 0 ] && echo clean || echo "rc=$rc")"
fi
if [ $bench = 1 ]; then
  if [ $quick = 1 ]; then pp=512,2048; tg=32; runs=2; else pp=512,2048,8192; tg=32,128; runs=5; fi
  for m in 120b 20b; do
    timeout 420 "$gptoss" bench --device cuda --random-weights $m --pp $pp --tg $tg --runs $runs \
      --json "$out/bench_$m.json" >"$out/bench_$m.md" 2>"$out/bench_$m.err"
    rc=$?
    cat "$out/bench_$m.md" | grep -v '^{'
    [ $rc = 0 ] || { tail -5 "$out/bench_$m.err"; status "bench $m" "FAIL rc=$rc"; }
  done
  # Per-kernel decode timings (microseconds per launch), for kernel work.
  timeout 300 "$gptoss" bench-kernels --model 120b >"$out/kernels_120b.md" 2>&1
  cat "$out/kernels_120b.md"
fi
echo
echo "| check | result |"
echo "|---|---|"
printf '%s\n' "${summary[@]}"
