# Session 17, round 6: where the engine's ~150-300 us between passes goes on the GPU machine's
# host. (1) The engine alone over a fake backend (5 ms passes, 64 and 32 streams of 512 in / 256
# out, a client thread each): host time a step. (2) perf of `serve` (20b) during a 32-stream run,
# by thread and symbol.
source tools/gpu/rounds/prelude.sh
ts fake backend
# (.gpu-carry-pack/hb was tests/engine/bench_engine_host.cpp's first form, built here and carried.)
for n in 64 32; do echo "hb $n: $(.gpu-carry-pack/hb $n 5000 256 | tr '\n' ' ')" >> $S; done
echo "perf: $(command -v perf) paranoid $(cat /proc/sys/kernel/perf_event_paranoid) cores $(nproc)" >> $S
GPTOSS_CUDA_TIMELINE=1 $g serve --device cuda --random-weights 20b --port 18000 --max-model-len 8192 --max-num-seqs 64 > $out/serve.log 2>&1 &
pid=$!
for _ in $(seq 200); do curl -sf localhost:18000/health >/dev/null && break; sleep 1; done
bsv() { timeout 100 $g bench-serve --base-url http://127.0.0.1:18000 --requests $(($1 * 2)) --concurrency $1 --input-len 512 --output-len 256 --ignore-eos 2>&1 | grep -E "^TTFT|^aggregate" >> $S; }
ts 32 plain; bsv 32
ts 32 under perf
( sleep 0.8; timeout 10 perf record -F 4000 -g -p $pid -o $out/perf.data -- sleep 2.0 > $out/perf.log 2>&1 ) &
bsv 32; wait  # (this wait also waited for the server: the call ran into its time limit; the summary came back)
tail -2 $out/perf.log >> $S
perf report -i $out/perf.data --no-children --sort comm,symbol 2>/dev/null | grep -E "^ +[0-9]" | head -45 | cut -c1-150 >> $S
perf report -i $out/perf.data --no-children --sort comm 2>/dev/null | grep -E "^ +[0-9]" | head -12 >> $S
kill -INT $pid; wait $pid; grep -E "cuda timeline" $out/serve.log >> $S
ts done
rm -rf $out/*.log $out/perf.data
cat $S
