#!/usr/bin/env bash
# Issue 13, Eagle3 on one GPU: the CUDA tests (hidden-state taps vs the CPU backend, the GPU draft
# head vs the host head, device taps, greedy eagle3 K=1..3 == plain on CUDA with the head on the
# host and on the GPU), the GPU draft step timed on random eagle3-20b / eagle3-120b heads over
# random targets of their shape, then the draft mechanics timed through the server: 120b random
# weights with a random eagle3-120b head (acceptance ~0: this times the head and the taps, it is
# not a speed-up) against plain decoding, one stream, the head on the GPU and on the host.
# Usage: tools/gpu/eagle3_check.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build-cuda}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPTOSS_CUDA=ON >/dev/null
cmake --build "$build" -j"$(nproc)" --target gptoss test_cuda_eagle3
"$build"/tests/cuda/test_cuda_eagle3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for size in 20b 120b; do
  "$build"/gptoss make-model --preset eagle3-$size --out "$tmp/eagle3-$size"
  for dense in skinny gemv; do
    GPTOSS_EAGLE3_DENSE=$dense GPTOSS_EAGLE3_BENCH_HEAD="$tmp/eagle3-$size" GPTOSS_EAGLE3_BENCH_TARGET=$size \
      "$build"/tests/cuda/test_cuda_eagle3 --gtest_filter='CudaEagle3.DraftStepCost'
  done
done
head="$tmp/eagle3-120b"
for mode in plain eagle3 eagle3-host; do
  extra=(); [ $mode != plain ] && extra=(--speculative-model "$head")
  host=0; [ $mode = eagle3-host ] && host=1
  GPTOSS_EAGLE3_HOST=$host "$build"/gptoss serve --device cuda --random-weights 120b --port 8013 --max-num-seqs 4 \
    "${extra[@]}" 2>"/tmp/eagle3-serve-$mode.log" &
  pid=$!
  for _ in $(seq 600); do curl -sf http://127.0.0.1:8013/health >/dev/null && break; sleep 1; done
  echo "== $mode"
  n=8; [ $mode = eagle3-host ] && n=2  # the host head: hundreds of ms a token
  "$build"/gptoss bench-serve --base-url http://127.0.0.1:8013 --requests $n --concurrency 1 --input-len 512 \
    --max-tokens 128 --ignore-eos
  kill $pid; wait $pid 2>/dev/null || true
done
