# Session 28, round 3: the router folded into o_proj at one token (RouterFold). Its kernel test,
# the neighbours' tests, the model tests, memcheck of the fold, then the step with the fold off
# (GPTOSS_ROUTER_FOLD=0) and on, alternating, 120b and 20b, bf16 and fp8 dense layers.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
ts tests
t fold 200 $K --gtest_filter='Kernels.RouterFoldedIntoOproj:Kernels.RouterRoute*'
grep -E "router fold" $out/fold.log >> $S
t model 200 $bin/test_cuda_model
ts memcheck
GPTOSS_TEST_SMALL=1 timeout 150 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.RouterFoldedIntoOproj' > $out/memcheck.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/memcheck.log | head -3 >> $S
ts steps
for rep in 1 2; do
  for m in 120b 20b; do
    for dd in bf16 fp8; do
      for fold in 0 1; do
        echo "== $m $dd fold=$fold" >> $S
        GPTOSS_ROUTER_FOLD=$fold timeout 60 $g bench --device cuda --random-weights $m --dense-dtype $dd --pp '' --tg 64 --batch 1,8 --runs 2 2>&1 \
          | grep -E "^\| random|rror" >> $S
      done
    done
  done
done
ts done
cat $S
