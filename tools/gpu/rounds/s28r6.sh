# Session 28, round 6: the router fold with its bias copied beside the sums by o_proj's block 0 (one
# L2 round trip for the routing), register-only top-k, and gate_up's row converted under its first
# weight loads. Kernel test, memcheck, the whole model suite; the step fold off / on, alternating.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
ts tests
t fold 100 $K --gtest_filter='Kernels.RouterFoldedIntoOproj:Kernels.RouterRoute*'
grep -E "router fold" $out/fold.log >> $S
GPTOSS_TEST_SMALL=1 timeout 150 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.RouterFoldedIntoOproj' > $out/memcheck.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/memcheck.log | head -3 >> $S
t model 200 $bin/test_cuda_model
grep -E "^2-layer" $out/model.log >> $S
ts steps
for rep in 1 2; do
  for cfg in "120b --dense-dtype bf16" "120b --dense-dtype fp8" "120b --mxfp4-layers all" "20b --dense-dtype bf16" "20b --dense-dtype fp8"; do
    for fold in 0 1; do
      echo "== $cfg fold=$fold" >> $S
      GPTOSS_ROUTER_FOLD=$fold timeout 60 $g bench --device cuda --random-weights $cfg --pp '' --tg 64 --batch 1 --runs 2 2>&1 \
        | grep -E "^\| random|rror" >> $S
    done
  done
done
ts done
cat $S
