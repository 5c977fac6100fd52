# Session 19, round 1. (a) A graph bucket's padding tokens take no expert pair (MoeRouting::n_valid,
# from the pass metadata; prepared in session 18 on branch s18-padding-unrouted): the routers with
# padding (RouterRoutePaddingTakesNoPair), the routers and combines generally, the model tests
# (BetweenBucketsBatchedDecodeEqualsAlone: 33 sequences in bucket 40); the step at between-bucket
# sizes (s18r7 with the padding routed: 20b x24 5109.91, x33 6132.22, x40 7695.05, x48 8454.67;
# 120b 2048.51, 2302.36, 2634.07, 2945.33). (b) 16-token passes in the unit-walking expert kernel
# at two blocks an SM (bench-kernels variants "units16 ks8 rt4 pf2 16w", "units16 ks8 rt2 pf4 16w"
# and their 8-token control "units ks8 rt4 pf2 16w"): bit for bit against the block-per-tile
# kernel, bench-kernels' expert rows at 20b 32/48/64 tokens, and the 20b step with each
# (GPTOSS_SKINNY_VARIANT=15/16/17) against the default.
# (Variants 15-17 ran on branch s19-units16-exp; main has GPTOSS_SKINNY_VARIANT but not them. The
# padding rows here carry the metadata bug fixed in a7051c3: see BENCHMARKS, nineteenth session.)
source tools/gpu/rounds/prelude.sh
t router_units_tests 120 $K --gtest_filter='Kernels.Router*:Kernels.MoeCombine*:Kernels.MoeRoute*:Kernels.SkinnyUnits*'
for m in 20b 120b; do
  ts bench $m
  timeout 150 $g bench --device cuda --random-weights $m --pp '' --tg 32 --batch 24,33,40,48 --runs 1 2>&1 | grep -E "^\|.*tg" >> $S
done
for mt in "20b 32" "20b 48" "20b 64"; do
  set -- $mt; ts bench-kernels $1 $2
  timeout 100 $g bench-kernels --model $1 --tokens $2 --iters 50 2>&1 | grep -E "experts (gate_up|down)" | grep -E "units|fragments|plain read" >> $S
done
for v in 0 15 16 17; do
  ts step 20b variant $v
  GPTOSS_SKINNY_VARIANT=$v timeout 120 $g bench --device cuda --random-weights 20b --pp '' --tg 32 --batch 32,48,64 --runs 1 2>&1 | grep -E "^\|.*tg" >> $S
done
ts test_cuda_model
t test_cuda_model 150 $bin/test_cuda_model
ts done
rm -f $out/*.log
cat $S
