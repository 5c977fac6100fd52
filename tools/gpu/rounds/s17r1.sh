# (Ran on branch s17-router-fold, whose tests these are; the fold was not merged.)
# Session 17, round 1 (binaries of branch s17-router-fold = main b467fe5 + the router fold, default
# off): main's first GPU run since 66bcae1/b467fe5 (all kernel tests, model, spec, sanitizers on
# the staged kernels) and the fold's first run (its tests, racecheck, the step off vs on).
source tools/gpu/rounds/prelude.sh
ts fold tests
t fold_kernel 200 $K --gtest_filter=Kernels.RouterFoldedIntoOproj
t fold_model 200 $bin/test_cuda_model --gtest_filter=CudaModel.TwoLayers120bShapes*
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $K --gtest_filter=Kernels.RouterFoldedIntoOproj --gtest_color=no > $out/$tool.log 2>&1
  echo "fold $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $out/$tool.log | tail -1)" >> $S
  GPTOSS_TEST_SMALL=1 timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $K --gtest_filter=Kernels.SkinnyDense --gtest_color=no > $out/$tool.log 2>&1
  echo "skinny $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $out/$tool.log | tail -1)" >> $S
done
ts bench
b() { local tag=$1; shift; timeout 100 $g bench --device cuda --random-weights "$@" --pp '' --tg 64 --runs 1 2>&1 | grep -E "^\| random" | sed "s/^/$tag /" >> $S; }
for m in 120b 20b; do for f in 0 1 0 1; do GPTOSS_ROUTER_FOLD=$f b "$m fold$f" $m --batch 1,2; done; done
for f in 0 1; do GPTOSS_ROUTER_FOLD=$f b "120b fp8 fold$f" 120b --dense-dtype fp8 --batch 1; done
ts model tests
t model 200 $bin/test_cuda_model
t spec 100 $bin/test_cuda_spec
ts kernel tests
t kernels 280 $K
ts done
rm -f $out/*.log
cat $S
