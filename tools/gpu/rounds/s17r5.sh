# Session 17, round 5 (round 4's binaries): --async-scheduling (plan step N+1 while N runs) against
# round 4's default, warm-up on: 20b at 32 (twice) and 64 streams, 120b at 32 and 64.
source tools/gpu/rounds/prelude.sh
bs() {
  timeout 100 $g bench-serve --base-url http://127.0.0.1:18000 --requests $(($1 * 2)) --concurrency $1 --input-len 512 \
    --output-len 256 --ignore-eos 2>&1 | grep -E "^TTFT|^aggregate|first error" >> $S
}
up() {
  GPTOSS_CUDA_TIMELINE=1 $g serve --device cuda --random-weights $1 --port 18000 --max-model-len 8192 --max-num-seqs 64 "${@:2}" > $out/serve.log 2>&1 &
  pid=$!
  for _ in $(seq 200); do curl -sf localhost:18000/health >/dev/null && break; sleep 1; done
  grep -E "warm-up" $out/serve.log >> $S
}
down() { kill -INT $pid; wait $pid; grep -E "cuda timeline|overlap" $out/serve.log >> $S; curl -s localhost:18000/metrics >/dev/null; }
for m in 20b 120b; do
  ts $m async; up $m --async-scheduling
  ts 32; bs 32; [ $m = 20b ] && { ts 32 again; bs 32; }; ts 64; bs 64
  curl -s localhost:18000/metrics | grep -E "overlapped_steps_total|steps_total" | grep -v "^#" >> $S
  down
done
ts done
rm -f $out/*.log
cat $S
