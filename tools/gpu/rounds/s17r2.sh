# (Ran on branch s17-router-fold, whose tests these are; the fold was not merged.)
# Session 17, round 2: the router fold with router_fold_runs fixed (it missed the decode family, so
# round 1's fold never ran): its tests, sanitizers, the step off vs on; then the kernel tests with
# their times (round 1's whole-binary run passed 280 s).
source tools/gpu/rounds/prelude.sh
ts fold tests
t fold_kernel 200 $K --gtest_filter=Kernels.RouterFoldedIntoOproj
t fold_model 200 $bin/test_cuda_model --gtest_filter=CudaModel.TwoLayers120bShapes*
grep -E "1-token prompt|150-token" $out/fold_model.log >> $S
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $K --gtest_filter=Kernels.RouterFoldedIntoOproj --gtest_color=no > $out/$tool.log 2>&1
  echo "fold $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $out/$tool.log | tail -1)" >> $S
done
ts bench
b() { local tag=$1; shift; timeout 100 $g bench --device cuda --random-weights "$@" --pp '' --tg 64 --runs 1 2>&1 | grep -E "^\| random|rror" | sed "s/^/$tag /" >> $S; }
for m in 120b 20b; do for f in 0 1 0 1; do GPTOSS_ROUTER_FOLD=$f b "$m fold$f" $m --batch 1,2; done; done
for f in 0 1; do GPTOSS_ROUTER_FOLD=$f b "120b fp8 fold$f" 120b --dense-dtype fp8 --batch 1; done
ts kernel tests
timeout 250 $K --gtest_color=no > $out/kernels.log 2>&1; echo "kernels rc=$?" >> $S
grep -E "^\[  FAILED|Failure" $out/kernels.log | head -6 >> $S
grep -E "^\[       OK \]" $out/kernels.log | sed -E 's/.*OK \] ([^ ]+) \(([0-9]+) ms\)/\2 \1/' | sort -rn | head -14 >> $S
grep -c "^\[       OK \]" $out/kernels.log >> $S; tail -3 $out/kernels.log >> $S
ts done
rm -f $out/*.log
cat $S
