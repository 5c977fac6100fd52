source tools/gpu/rounds/prelude.sh
ts tests
t v5 300 $K --gtest_filter='Kernels.MoeMxfp4ExpertGemmV5:Kernels.ExpertGemmAwkwardGroups'
GPTOSS_TEST_SMALL=1 timeout 150 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.MoeMxfp4ExpertGemmV5:Kernels.ExpertGemmAwkwardGroups' --gtest_color=no > $out/san.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/san.log | head -5 >> $S
ts kernels
for spec in "120b 256" "120b 512" "120b 1024" "20b 256" "20b 512" "120b 2048"; do
  set -- $spec
  timeout 100 $g bench-kernels --model $1 --tokens $2 --iters 5 > $out/bk_$1_$2.txt 2>&1
  grep -E "gate_up \+ down" $out/bk_$1_$2.txt | grep -E "v5" | grep kperm | sed "s/^/$1 $2 /" >> $S
done
ts pp
for m in 120b 20b; do
  timeout 150 $g bench --device cuda --random-weights $m --pp 256,512,1024,2048 --tg '' --runs 3 2>&1 | grep -E "^\| random" >> $S
done
ts serve
srv 18101 120b -- 32
ts done
cat $S
