#!/usr/bin/env bash
# Speculative decoding on the CUDA backend (issue 13), in one device call: the `cuda` test that
# speculative greedy decoding equals plain greedy (test_cuda_spec), then for each model the
# single-stream decode speed of `gptoss serve --speculative-config` (n-gram, K = 1..4) against
# plain serving, driven by bench-serve:
#   loop     token-id prompts of two turns of the served loop model's cycle, greedy, 256 tokens,
#            one request at a time: text the drafter predicts (acceptance near 100%)
#   rep      a repetitive chat prompt, greedy (temperature 0), 256 tokens, one request at a time
#   rep-c8   the same, 8 requests in flight
#   nomatch  random-token prompts sampled at temperature 1 (drafts almost never match): the cost
#            of speculation when it does not pay
# What the figures mean with random weights: the n-gram drafter proposes continuations of
# n-grams already in the prompt + output. Random weights do not copy the prompt, so a
# "repeat this JSON" prompt does not help by itself; what the drafter finds in `rep` is the
# loops that greedy decoding of random weights falls into. The served model is a loop model
# (`--random-loop-tokens`, LoopSpec in model/make_model.h): random weights but for LOOP
# embedding and lm_head rows, so that greedy decoding walks the cycle of ids 1000..1000+LOOP-1;
# the `loop` workload is the upper bound of what n-gram speculation buys at real shapes (every
# draft right), the other workloads behave as on plain random weights. Real checkpoints on
# repetitive text (code edits, repeated JSON) need their own run.
#
#   tools/gpu/spec_round.sh                 # builds build-gpu/ (gptoss, test_cuda_spec)
#   tools/gpu/spec_round.sh --prebuilt DIR  # DIR: gptoss, test_cuda_spec, lib/, data/tiny-gptoss
# Environment: MODELS (default "20b 120b"; one model per device call keeps it under 10 minutes),
# KS (default "1 2 3 4"), LOOP (the loop model's cycle, default 64; 0: plain random weights and
# no `loop` workload). Logs go to $OUT.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${OUT:-$root/gpu-check-out}
mkdir -p "$out"
if [ "${1:-}" = "--prebuilt" ]; then
  bin=$(cd "$2" && pwd)
  export LD_LIBRARY_PATH="$bin/lib:${LD_LIBRARY_PATH:-}" GPTOSS_TEST_DATA_DIR="$bin/data"
  [ -f "$bin/o200k_base.tiktoken" ] && export GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
  gptoss=$bin/gptoss; tspec=$bin/test_cuda_spec
else
  cmake -S "$root" -B "$root/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release >"$out/cmake.log" 2>&1 &&
    ninja -C "$root/build-gpu" gptoss test_cuda_spec >"$out/build.log" 2>&1 ||
    { echo "build failed: see $out/build.log"; tail -30 "$out/build.log"; exit 1; }
  gptoss=$root/build-gpu/gptoss; tspec=$root/build-gpu/tests/cuda/test_cuda_spec
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

echo "== test_cuda_spec (speculative greedy == plain greedy, verify rows == one at a time)"
timeout 300 "$tspec" --gtest_color=no >"$out/test_cuda_spec.log" 2>&1
echo "rc=$?"
grep -E "K=|rel err|FAILED|Failure|^\[  (PASSED|FAILED)" "$out/test_cuda_spec.log" | head -40

prompts=$out/spec_prompts.txt
json='{"id": 17, "name": "widget", "tags": ["a", "b", "c"], "price": 12.5, "in_stock": true}'
for i in 1 2 3 4; do
  echo "Repeat this JSON object exactly 20 times, one per line, nothing else: $json (copy $i)"
done >"$prompts"

LOOP=${LOOP:-64}
loop_flags=()
workloads="rep rep-c8 nomatch"
if [ "$LOOP" -gt 0 ]; then
  loop_flags=(--random-loop-tokens "$LOOP")
  workloads="loop $workloads"
  # Four prompts, each two turns of the cycle from another starting point, as token ids.
  loop_prompts=$out/spec_loop_prompts.jsonl
  for s in 0 1 2 3; do
    ids=""
    for j in $(seq 0 $((2 * LOOP - 1))); do ids="$ids${ids:+, }$((1000 + (s * 16 + j) % LOOP))"; done
    echo "{\"prompt\": [$ids]}"
  done >"$loop_prompts"
fi

port=18300
# Serves model $1 with extra flags $3..; name $2. Prints one summary line per workload.
run_config() {
  local m=$1 name=$2
  shift 2
  "$gptoss" serve --device cuda --random-weights "$m" "${loop_flags[@]}" --port $port --served-model-name m \
    --max-model-len 4096 --max-num-seqs 8 "$@" >"$out/serve_${m}_$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 300); do curl -sf localhost:$port/health >/dev/null && break; sleep 1; done
  if ! curl -sf localhost:$port/health >/dev/null; then
    echo "$m $name: server did not come up"; tail -5 "$out/serve_${m}_$name.log"; kill $pid; wait $pid; return
  fi
  local B="$gptoss bench-serve --base-url http://127.0.0.1:$port --model m --max-tokens 256 --ignore-eos --no-token-timing"
  for w in $workloads; do
    case $w in
      loop) args="--prompts $loop_prompts --requests 4 --concurrency 1 --temperature 0" ;;
      rep) args="--prompts $prompts --requests 4 --concurrency 1 --temperature 0" ;;
      rep-c8) args="--prompts $prompts --requests 16 --concurrency 8 --temperature 0" ;;
      nomatch) args="--input-len 128 --requests 4 --concurrency 1 --temperature 1 --seed 5" ;;
    esac
    timeout 240 $B $args >"$out/bench_${m}_${name}_$w.txt" 2>&1
    local dec agg acc
    dec=$(sed -n 's/^decode per stream (median): \([0-9.]*\) tok\/s/\1/p' "$out/bench_${m}_${name}_$w.txt")
    agg=$(sed -n 's/^aggregate: \([0-9.]*\) tok\/s output.*/\1/p' "$out/bench_${m}_${name}_$w.txt")
    acc=$(sed -n 's/.*(acceptance rate \([0-9.]*%\)).*/\1/p' "$out/bench_${m}_${name}_$w.txt")
    echo "| $m | $name | $w | ${dec:-?} | ${agg:-?} | ${acc:--} |"
  done
  kill -TERM $pid
  wait $pid
}

echo
echo "| model | config | workload | decode tok/s per stream (median) | aggregate tok/s | acceptance |"
echo "|---|---|---|---|---|---|"
for m in ${MODELS:-20b 120b}; do
  run_config "$m" plain
  for k in ${KS:-1 2 3 4}; do
    run_config "$m" "ngram-k$k" --speculative-config \
      "{\"method\":\"ngram\",\"num_speculative_tokens\":$k,\"prompt_lookup_max\":4,\"prompt_lookup_min\":1}"
  done
done
