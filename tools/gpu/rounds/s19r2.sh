# Session 19, round 2: padding tokens without expert pairs (MoeRouting::n_valid), same binary and
# machine A/B through GPTOSS_ROUTE_PADDING=1 (padding routed, as before) against 0 (the change):
# memcheck of the router kernels, the step at between-bucket sizes twice each way, and Poisson
# serving (s18r8's workload) each way.
# (Its numbers carry the metadata bug fixed in a7051c3: see BENCHMARKS, nineteenth session.)
source tools/gpu/rounds/prelude.sh
ts memcheck
GPTOSS_TEST_SMALL=1 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $K --gtest_color=no \
  --gtest_filter='Kernels.Router*:Kernels.MoeRoute*:Kernels.MoeCombine*' > $out/memcheck.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/memcheck.log | head -4 >> $S
for r in 1 2; do
  for pad in 1 0; do
    for m in 20b 120b; do
      ts run $r $m GPTOSS_ROUTE_PADDING=$pad
      GPTOSS_ROUTE_PADDING=$pad timeout 100 $g bench --device cuda --random-weights $m --pp '' --tg 32 --batch 24,33,40,48 --runs 1 2>&1 | grep -E "^\|.*tg" >> $S
    done
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
