# Session 18, round 7: decode graph buckets in steps of 8 past 8 (1 2 4 8 16 24 ... 64; a pass
# was padded to the next power of two, and padding tokens are routed to experts like real ones).
# test_cuda_model (a 33-sequence step: bucket 40, seven padding tokens) and test_cuda_spec; the
# step at batch sizes between the old buckets, old buckets (GPTOSS_GRAPH_BUCKETS_POW2=1) and new; serve
# at 32 and 64 streams (the old buckets' figures: s18r4).
source tools/gpu/rounds/prelude.sh
t test_cuda_model 300 $bin/test_cuda_model
t test_cuda_spec 200 $bin/test_cuda_spec
for m in 20b 120b; do for pow2 in 1 0; do
  ts bench $m GPTOSS_GRAPH_BUCKETS_POW2=$pow2
  GPTOSS_GRAPH_BUCKETS_POW2=$pow2 timeout 150 $g bench --device cuda --random-weights $m --pp '' --tg 32 --batch 24,33,40,48 \
    --runs 1 2>&1 | grep -E "^\|.*tg" >> $S
done; done
for m in 20b 120b; do
  ts serve $m; serve_cs $m -- 32 64
done
ts done
rm -f $out/*.log
cat $S
