#!/usr/bin/env bash
# One device call for decode-kernel work (issue 10): the kernel and model tests, memcheck of the
# small kernel shapes, bench at 120b/20b for each dense/MXFP4 choice, per-kernel timings at 1-64
# tokens, and the --random-weights determinism check. Logs land in $OUT; a summary prints last.
#   tools/gpu/decode_round.sh DIR      # DIR: prebuilt gptoss, test_cuda_kernels, test_cuda_model, lib/, data/
set -uo pipefail
bin=$(cd "$1" && pwd); out=${OUT:-/tmp/decode-round}; mkdir -p "$out"
export LD_LIBRARY_PATH="$bin/lib:${LD_LIBRARY_PATH:-}" GPTOSS_TEST_DATA_DIR="$bin/data"
g=$bin/gptoss
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader
log() { echo "== $*"; }
# The decode kernels' tests only: the whole binary takes ~430 s on the H200 (seventeenth session),
# the attention and prefill GEMM tests most of it (tools/gpu/check.sh runs them all, in halves).
log kernels; timeout 300 "$bin/test_cuda_kernels" --gtest_color=no \
  --gtest_filter='*Skinny*:*Fragments*:*StreamK*:*Route*:*Router*:*Combine*:*Linear*:*Argmax*:*SampleRows*:*RmsNorm*:*Embed*' \
  >"$out/kernels.log" 2>&1; echo "rc=$?"
grep -E "FAILED|Failure|Expected|Which is|rel err|^\[  (PASSED|FAILED)" "$out/kernels.log" | head -40
log model; timeout 300 "$bin/test_cuda_model" --gtest_color=no >"$out/model.log" 2>&1; echo "rc=$?"
grep -E "FAILED|Failure|rel err|greedy|^\[  (PASSED|FAILED)" "$out/model.log" | head -30
log memcheck; GPTOSS_TEST_SMALL=1 timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/test_cuda_kernels" \
  --gtest_color=no --gtest_filter='*Skinny*:*Fragments*' >"$out/memcheck.log" 2>&1; echo "rc=$?"; tail -3 "$out/memcheck.log"
log determinism
for i in 1 2; do timeout 120 "$g" logits --device cuda --random-weights 20b --prompt-ids 1,2,3,4,5 --out "$out/l$i.safetensors" >/dev/null 2>&1; done
cmp "$out/l1.safetensors" "$out/l2.safetensors" && echo "logits identical across runs" || echo "logits DIFFER across runs"
for m in 120b 20b; do
  for v in "" "--dense-dtype fp8" "--mxfp4-layers all" "--mxfp4-backend gemv"; do
    log "bench $m $v"
    timeout 150 "$g" bench --device cuda --random-weights $m --pp 2048 --tg 128 --runs 2 $v 2>&1 | grep -E "^\|" | grep -v -- "---"
  done
done
for t in 1 8 32 64; do log "bench-kernels 120b tokens $t"; timeout 100 "$g" bench-kernels --model 120b --tokens $t 2>&1 | tee "$out/kernels_120b_$t.md" | grep -E "experts|skinny|combine"; done
