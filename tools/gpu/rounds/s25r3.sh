# Session 25, round 3: the mbarrier hand-off at 128-pair tiles only (the width where s25r2 measured
# it faster), with the cheaper 128-pair cost in the automatic width: the version 5 tests, the
# width rule, the model tests; bench-kernels 20b at 8192 tokens; the model's prefill with
# GPTOSS_EXPERT_GEMM_V5_MBAR=0 (as before) and 1 (the new default), alternating; serving at 64.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
ts tests
t k 200 $K --gtest_filter='Kernels.MoeMxfp4ExpertGemmV5:ExpertGemmV5Width.*:ExpertGemmV5Warpgroups.*'
t model 200 $bin/test_cuda_model
ts bench-kernels
for mb in 0 1; do
  echo "== 20b 8192 MBAR=$mb" >> $S
  GPTOSS_EXPERT_GEMM_V5_MBAR=$mb timeout 90 $g bench-kernels --model 20b --tokens 8192 --iters 5 > $out/bk.txt 2>&1
  grep -E "gate_up \+ down.*v5.*kperm" $out/bk.txt | sed -E 's/^\| experts gate_up \+ down \| [^|]*\| //' >> $S
done
ts prefill
for m in 120b 20b; do for mb in 0 1 0 1; do
  echo "== $m MBAR=$mb" >> $S
  GPTOSS_EXPERT_GEMM_V5_MBAR=$mb timeout 100 $g bench --device cuda --random-weights $m --pp 512,1024,2048,4096,8192 --tg '' --runs 1 2>&1 | grep -E "^\| random" >> $S
done; done
ts serve
srv 18100 120b -- 64
srv 18101 20b -- 64
ts done
cat $S
