# Session 19, round 5: the real-token count a decode graph reads now sits at a fixed place in the
# pass metadata (pass_meta_layout). Before, it sat after the page table, whose length grows with
# the contexts, so a graph replayed after a page-table growth read a page id as the count and left
# real tokens without experts: s19r2-s19r4's gains for padding without pairs were mostly that bug.
# (1) CudaModel.GraphReplayAfterPageTableGrowth on a test binary built with the bug (must fail)
# and on the fix; test_cuda_model. (2) The same-round A/B of GPTOSS_ROUTE_PADDING=1 (padding
# routed, as before 4807a2f) against 0 on the fix: the step at between-bucket sizes, serving at 32
# and 64 streams, Poisson arrivals.
source tools/gpu/rounds/prelude.sh
xz -dc .gpu-carry-pack/test_cuda_model_bug.xz > $bin/test_cuda_model_bug; chmod +x $bin/test_cuda_model_bug
t model_test_with_bug 120 $bin/test_cuda_model_bug --gtest_filter='CudaModel.GraphReplayAfterPageTableGrowth:PassMetaLayout.*'
t test_cuda_model 150 $bin/test_cuda_model
for pad in 1 0; do
  for m in 20b 120b; do
    ts bench $m GPTOSS_ROUTE_PADDING=$pad
    GPTOSS_ROUTE_PADDING=$pad timeout 100 $g bench --device cuda --random-weights $m --pp '' --tg 32 --batch 24,33,40,48 --runs 1 2>&1 | grep -E "^\|.*tg" >> $S
  done
done
for m in 20b 120b; do
  for pad in 1 0; do
    ts serve $m GPTOSS_ROUTE_PADDING=$pad; export GPTOSS_ROUTE_PADDING=$pad
    serve_cs $m -- 32 64
  done
done
for mr in "20b 16 200" "120b 6 120"; do
  set -- $mr
  for pad in 1 0; do
    ts $1 rate $2 GPTOSS_ROUTE_PADDING=$pad; export GPTOSS_ROUTE_PADDING=$pad; serve_up $1
    bench_rate $2 $3
    serve_down
  done
done
ts done
rm -f $out/*.log
cat $S
