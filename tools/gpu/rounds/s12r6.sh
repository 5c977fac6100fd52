source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
ts v5-tests
t v5 200 $K --gtest_filter='Kernels.MoeMxfp4ExpertGemmV5:Kernels.ExpertGemmAwkwardGroups'
grep -E "expert gemm v5|moe n=" $out/v5.log | head -20 >> $S
GPTOSS_TEST_SMALL=1 timeout 200 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.MoeMxfp4ExpertGemmV5:Kernels.ExpertGemmAwkwardGroups' --gtest_color=no > $out/san.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/san.log | head -5 >> $S
ts kernels
for m in 120b 20b; do
  timeout 120 $g bench-kernels --model $m --tokens 2048 --iters 5 > $out/bk_$m.txt 2>&1
  grep -E "expert GEMM v(3 m64|5)" $out/bk_$m.txt | grep fragments >> $S
done
timeout 120 $g bench-kernels --model 120b --tokens 512 --iters 5 > $out/bk_120b_512.txt 2>&1
grep -E "gate_up \+ down" $out/bk_120b_512.txt | grep -E "v3 m64|v5" | grep fragments >> $S
ts pp
for v in v3 v5; do for m in 120b 20b; do
  GPTOSS_EXPERT_GEMM=$v timeout 100 $g bench --device cuda --random-weights $m --pp 512,2048 --tg '' --runs 2 2>&1 | grep -E "^\| random" | sed "s/^/$v /" >> $S
done; done
ts rest-of-kernel-tests
t krest 240 $K --gtest_filter='Kernels.MoeMxfp4FragmentsDecode:Kernels.SkinnyUnits*:Kernels.MoeRoute*:Kernels.MoeCombine*:Kernels.Router*:Kernels.Argmax:Kernels.Sample*:Kernels.Attention*:Kernels.Flash*:DecodeAttentionPlan.*:DenseGemmChoice.*:CublasLt.*'
grep -c "^\[       OK" $out/krest.log >> $S
ts model
t model 200 $bin/test_cuda_model
GPTOSS_EXPERT_GEMM=v5 timeout 200 $bin/test_cuda_model --gtest_color=no > $out/model_v5.log 2>&1; echo "model v5 rc=$?" >> $S; grep -E "^\[  FAILED|PASSED" $out/model_v5.log >> $S
t spec 100 $bin/test_cuda_spec
t eagle 100 $bin/test_cuda_eagle3
ts tg
for m in 120b 20b; do timeout 100 $g bench --device cuda --random-weights $m --pp '' --tg 64 --batch 1,8,32,64 --runs 1 2>&1 | grep -E "^\| random" >> $S; done
ts done
cat $S
