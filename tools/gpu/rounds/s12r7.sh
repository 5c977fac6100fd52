source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
ts tests
t k2 200 $K --gtest_filter='Kernels.ExpertGemmV5Preferred:Kernels.Flash*:DecodeAttentionPlan.*:DenseGemmChoice.*:CublasLt.*'
grep -c "^\[       OK" $out/k2.log >> $S
t model 200 $bin/test_cuda_model
ts pp
for v in auto v3; do for m in 120b 20b; do
  GPTOSS_EXPERT_GEMM=$v timeout 100 $g bench --device cuda --random-weights $m --pp 512,2048 --tg '' --runs 2 2>&1 | grep -E "^\| random" | sed "s/^/$v /" >> $S
done; done
ts serve
srv 18100 120b -- 32 64
GPTOSS_EXPERT_GEMM=v3 srv 18101 120b -- 32
ts done
cat $S
