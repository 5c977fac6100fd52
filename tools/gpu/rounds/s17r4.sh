# Session 17, round 4 (binaries of main + the start-up warm-up): how much a server's first
# bench-serve run pays for one-time costs (--warmup off: the same run twice), then the warm-up
# on (the default with --device cuda): 20b and 120b at 32 and 64 streams; the model tests.
source tools/gpu/rounds/prelude.sh
bs() {  # bench-serve at concurrency $1 on :18000
  timeout 100 $g bench-serve --base-url http://127.0.0.1:18000 --requests $(($1 * 2)) --concurrency $1 --input-len 512 \
    --output-len 256 --ignore-eos 2>&1 | grep -E "^TTFT|^aggregate|first error" >> $S
}
up() {  # serve model $1 with flags ${@:2}
  GPTOSS_CUDA_TIMELINE=1 $g serve --device cuda --random-weights $1 --port 18000 --max-model-len 8192 --max-num-seqs 64 "${@:2}" > $out/serve.log 2>&1 &
  pid=$!
  for _ in $(seq 200); do curl -sf localhost:18000/health >/dev/null && break; sleep 1; done
  grep -E "warm-up" $out/serve.log >> $S
}
down() { kill -INT $pid; wait $pid; grep -E "cuda timeline" $out/serve.log >> $S; }
ts 20b warmup off; up 20b --warmup off
ts run 1 of 32; bs 32; ts run 2 of 32; bs 32; down
ts 20b warmup auto; up 20b
ts run 1 of 32; bs 32; ts 64; bs 64; down
ts 120b warmup auto; up 120b
ts run 1 of 32; bs 32; ts 64; bs 64; down
ts model tests
t model 200 $bin/test_cuda_model
ts done
rm -f $out/*.log
cat $S
