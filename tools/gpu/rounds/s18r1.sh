# Prepared in session 17 for the next GPU session: --async-scheduling with the early launch
# (Engine::take_tokens_early) against the default, warm-up on, same binaries: 20b at 32 (twice) and
# 64 streams, 120b at 32 and 64; the GPU timeline's idle share and engine gap for each. Also the
# engine alone on this host (tests/engine/bench_engine_host, carried beside the binaries).
# (Ran while the synchronous loop was the default: since s18r4 "" is the async loop, and the
# synchronous one is --no-async-scheduling.)
source tools/gpu/rounds/prelude.sh
[ -x $bin/bench_engine_host ] && for a in ${ENGINE_RUNS:-0 1}; do $bin/bench_engine_host 64 5000 256 $a >> $S; done
for m in 20b 120b; do for flag in "" --async-scheduling; do
  ts $m $flag; serve_up $m $flag
  ts 32; bench_c 32; [ $m = 20b ] && { ts 32 again; bench_c 32; }; ts 64; bench_c 64
  serve_down
done; done
ts done
rm -f $out/*.log
cat $S
