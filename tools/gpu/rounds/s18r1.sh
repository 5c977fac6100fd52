# Prepared in session 17 for the next GPU session: --async-scheduling with the early launch
# (Engine::take_tokens_early) against the default, warm-up on, same binaries: 20b at 32 (twice) and
# 64 streams, 120b at 32 and 64; the GPU timeline's idle share and engine gap for each. Also the
# engine alone on this host (tests/engine/bench_engine_host, carried beside the binaries).
source tools/gpu/rounds/prelude.sh
bs() {
  timeout 100 $g bench-serve --base-url http://127.0.0.1:18000 --requests $(($1 * 2)) --concurrency $1 --input-len 512 \
    --output-len 256 --ignore-eos 2>&1 | grep -E "^TTFT|^aggregate|first error" >> $S
}
up() {
  GPTOSS_CUDA_TIMELINE=1 $g serve --device cuda --random-weights $1 --port 18000 --max-model-len 8192 --max-num-seqs 64 "${@:2}" > $out/serve.log 2>&1 &
  pid=$!
  for _ in $(seq 200); do curl -sf localhost:18000/health >/dev/null && break; sleep 1; done
}
down() { kill -INT $pid; wait $pid; grep -E "cuda timeline" $out/serve.log >> $S; }
[ -x $bin/bench_engine_host ] && for a in 0 1; do $bin/bench_engine_host 64 5000 256 $a >> $S; done
for m in 20b 120b; do for flag in "" --async-scheduling; do
  ts $m $flag; up $m $flag
  ts 32; bs 32; [ $m = 20b ] && { ts 32 again; bs 32; }; ts 64; bs 64
  down
done; done
ts done
rm -f $out/*.log
cat $S
