# Session 16, round 4 (final binaries): sanitizers over the staged kernels (SkinnyDense's small
# cases include a qkv and an o_proj shape at 1-2 tokens), the model and spec tests, the step at
# every batch size, the dense kernels alone with staging off and on.
source tools/gpu/rounds/prelude.sh
ts sanitizers
for tool in memcheck racecheck; do
  GPTOSS_TEST_SMALL=1 timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $K --gtest_filter=Kernels.SkinnyDense --gtest_color=no > $out/$tool.log 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $out/$tool.log | tail -1)" >> $S
done
ts model
t model 200 $bin/test_cuda_model
t spec 120 $bin/test_cuda_spec
ts bench
for m in 120b 20b; do
  timeout 120 $g bench --device cuda --random-weights $m --pp '' --tg 64 --batch 1,2,4,8,32,64 --runs 2 2>&1 | grep -E "^\| random" >> $S
done
ts kernels
for st in 0 32; do
  GPTOSS_DENSE_STAGE=$st timeout 60 $g bench-kernels --model 120b --tokens 1 --iters 100 > $out/k.log 2>&1
  grep -iE "qkv|o_proj" $out/k.log | head -8 | sed "s/^/st$st /" >> $S
done
ts done
rm -f $out/*.log
cat $S
