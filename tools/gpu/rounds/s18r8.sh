# Session 18, round 8: the decode graph buckets under Poisson arrivals (running counts drift between
# buckets): serve with the old buckets (GPTOSS_GRAPH_BUCKETS_POW2=1) and the new, bench-serve at a
# fixed request rate with uniform prompt and output lengths; TTFT / TPOT / ITL and the timeline.
source tools/gpu/rounds/prelude.sh
for mr in "20b 16 200" "120b 6 120"; do
  set -- $mr; m=$1; rate=$2; n=$3
  for pow2 in 1 0; do
    ts $m rate $rate GPTOSS_GRAPH_BUCKETS_POW2=$pow2
    export GPTOSS_GRAPH_BUCKETS_POW2=$pow2; serve_up $m
    bench_rate $rate $n
    serve_down
  done
done
ts done
rm -f $out/*.log
cat $S
