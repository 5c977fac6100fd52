source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
ts tests
t attn 200 $K --gtest_filter='Kernels.AttentionDecodeStored*:Kernels.MoeMxfp4ExpertGemmV5:Kernels.ExpertGemmAwkwardGroups'
grep -E "stored plan|expert gemm v5" $out/attn.log | awk '{print $NF}' | sort -g | tail -3 >> $S
GPTOSS_TEST_SMALL=1 timeout 150 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.AttentionDecodeStored*:Kernels.MoeMxfp4ExpertGemmV5' --gtest_color=no > $out/san.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/san.log | head -5 >> $S
ts kernels
for m in 120b 20b; do
  timeout 100 $g bench-kernels --model $m --tokens 2048 --iters 5 > $out/bk_$m.txt 2>&1
  grep -E "expert GEMM v(3 m64|5)" $out/bk_$m.txt | grep fragments >> $S
done
timeout 100 $g bench-kernels --model 120b --tokens 512 --iters 5 > $out/bk_120b_512.txt 2>&1
grep -E "gate_up \+ down" $out/bk_120b_512.txt | grep -E "v3 m64|v5" | grep fragments >> $S
ts pp
for v in auto v3; do for m in 120b 20b; do
  GPTOSS_EXPERT_GEMM=$v timeout 100 $g bench --device cuda --random-weights $m --pp 512,2048 --tg '' --runs 2 2>&1 | grep -E "^\| random" | sed "s/^/$v /" >> $S
done; done
ts serve
srv 18100 120b -- 32
ts spec-test
t spec 150 $bin/test_cuda_spec
ts done
cat $S
