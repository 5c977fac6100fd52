source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
ts tests
t v5 200 $K --gtest_filter='Kernels.MoeMxfp4ExpertGemmV5:Kernels.ExpertGemmAwkwardGroups'
grep -E "expert gemm v5 frag|moe n=" $out/v5.log | head -12 >> $S
GPTOSS_TEST_SMALL=1 timeout 200 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.MoeMxfp4ExpertGemmV5:Kernels.ExpertGemmAwkwardGroups' --gtest_color=no > $out/san.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/san.log | head -5 >> $S
ts kernels
for m in 120b 20b; do
  timeout 120 $g bench-kernels --model $m --tokens 2048 --iters 5 > $out/bk_$m.txt 2>&1
  grep -E "expert GEMM v(3 m64|5)" $out/bk_$m.txt | grep fragments >> $S
done
ts pp
for v in v3 v5; do for m in 120b 20b; do
  GPTOSS_EXPERT_GEMM=$v timeout 100 $g bench --device cuda --random-weights $m --pp 512,2048 --tg '' --runs 2 2>&1 | grep -E "^\| random" | sed "s/^/$v /" >> $S
done; done
ts done
cat $S
