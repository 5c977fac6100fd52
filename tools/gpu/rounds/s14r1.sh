source tools/gpu/rounds/prelude.sh
ts tests
t v5 300 $K --gtest_filter='Kernels.MoeMxfp4ExpertGemmV5:Kernels.ExpertGemmAwkwardGroups'
GPTOSS_TEST_SMALL=1 timeout 150 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.MoeMxfp4ExpertGemmV5:Kernels.ExpertGemmAwkwardGroups' --gtest_color=no > $out/san.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/san.log | head -5 >> $S
ts kernels
for spec in "120b 2048" "20b 2048" "120b 512" "120b 1024" "120b 4096" "20b 1024" "20b 4096"; do
  set -- $spec
  timeout 100 $g bench-kernels --model $1 --tokens $2 --iters 5 > $out/bk_$1_$2.txt 2>&1
  grep -E "gate_up \+ down" $out/bk_$1_$2.txt | grep -E "v5" | sed "s/^/$1 $2 /" >> $S
done
ts pp
for m in 120b 20b; do
  timeout 100 $g bench --device cuda --random-weights $m --pp 512,2048,8192 --tg '' --runs 2 2>&1 | grep -E "^\| random" | sed "s/^/new /" >> $S
  GPTOSS_EXPERT_GEMM_V5_N=64 timeout 100 $g bench --device cuda --random-weights $m --pp 512,2048 --tg '' --runs 2 2>&1 | grep -E "^\| random" | sed "s/^/n64 /" >> $S
  GPTOSS_EXPERT_GEMM_KPERM=0 timeout 100 $g bench --device cuda --random-weights $m --pp 512,2048 --tg '' --runs 2 2>&1 | grep -E "^\| random" | sed "s/^/nokperm /" >> $S
done
ts decode-breakdown
timeout 100 $g bench-kernels --model 120b --tokens 1 --iters 50 > $out/bk_120b_1.txt 2>&1
timeout 100 $g bench-kernels --model 120b --tokens 1 --iters 50 --attention-only > $out/bk_120b_1_attn.txt 2>&1
ts serve
srv 18100 20b -- 32 64
srv 18101 120b -- 32 64
ts done
cat $S
