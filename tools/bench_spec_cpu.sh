#!/bin/bash
# Speculative decoding on the CPU: tokens/s of 6 single-stream /v1/completions requests (256
# tokens each) on a repetitive prompt (greedy; the model falls into loops the n-gram drafter
# finds) and on random prompts sampled at temperature 1 (drafts mostly miss), then the
# server's draft/accepted counters.
# usage (repo root): tools/bench_spec_cpu.sh PORT NAME [serve flags...]
#   e.g. tools/bench_spec_cpu.sh 18461 plain --model tests/data/tiny-gptoss
#        tools/bench_spec_cpu.sh 18462 k2 --model tests/data/tiny-gptoss --speculative-config '{"method":"ngram","num_speculative_tokens":2}'
G=${GPTOSS:-build-cpu/gptoss}
port=$1; name=$2; shift 2
tmp=$(mktemp -d)
$G serve --port "$port" --threads 2 --served-model-name t --max-model-len 1024 "$@" > "$tmp/serve.log" 2>&1 &
pid=$!
for i in $(seq 1 240); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.5; done
for mode in "rep 0" "rand 1"; do
  set -- $mode
  tot=0
  for r in 1 2 3 4 5 6; do
    if [ "$1" = rep ]; then
      p="[$(python3 -c "print(','.join(str((k%5)*37+$r*11) for k in range(30)))")]"
    else
      p="[$(python3 -c "import random; random.seed($r); print(','.join(str(random.randrange(512)) for k in range(30)))")]"
    fi
    t=$(curl -s -o "$tmp/out-$1-$r.json" -w '%{time_total}' "http://127.0.0.1:$port/v1/completions" \
          -H 'Content-Type: application/json' \
          -d "{\"model\":\"t\",\"prompt\":$p,\"max_tokens\":256,\"temperature\":$2,\"seed\":$r,\"ignore_eos\":true}")
    tot=$(python3 -c "print($tot+$t)")
  done
  echo "$name $1: 6 requests x 256 tokens in $tot s: $(python3 -c "print(round(6*256/$tot,1))") tok/s"
done
curl -s "http://127.0.0.1:$port/metrics" | grep "^gptoss:spec"
kill $pid; wait $pid 2>/dev/null
rm -rf "$tmp"
