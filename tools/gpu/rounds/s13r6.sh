source tools/gpu/rounds/prelude.sh
ts tests
t v5 200 $K --gtest_filter='Kernels.MoeMxfp4ExpertGemmV5:Kernels.ExpertGemmAwkwardGroups'
GPTOSS_TEST_SMALL=1 timeout 150 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.MoeMxfp4ExpertGemmV5:Kernels.ExpertGemmAwkwardGroups' --gtest_color=no > $out/san.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/san.log | head -5 >> $S
ts kernels
for m in 120b 20b; do
  timeout 100 $g bench-kernels --model $m --tokens 2048 --iters 5 > $out/bk_$m.txt 2>&1
  grep -E "gate_up|down" $out/bk_$m.txt | grep -E "v5" >> $S
done
timeout 100 $g bench-kernels --model 120b --tokens 512 --iters 5 > $out/bk_120b_512.txt 2>&1
grep -E "gate_up \+ down" $out/bk_120b_512.txt | grep -E "v3 m64|v5" | grep fragments >> $S
ts pp
for m in 120b 20b; do
  timeout 100 $g bench --device cuda --random-weights $m --pp 512,2048 --tg '' --runs 2 2>&1 | grep -E "^\| random" >> $S
done
ts done
cat $S
