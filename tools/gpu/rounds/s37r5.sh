# Session 37, round 5: version 5's persistent CTAs where a CTA fills its SM (four warpgroups, 64
# pairs and up; GPTOSS_EXPERT_GEMM_V5_PERSIST=1) against a CTA an item (=0): bench-kernels' v5 rows,
# the model's prefill alternating, the version 5 tests (persistent by default), the model tests.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
ts bench-kernels
for mt in 120b:4096 120b:2048 20b:2048; do for p in 1 0; do
  m=${mt%:*}; tk=${mt#*:}
  echo "== $m $tk PERSIST=$p" >> $S
  GPTOSS_EXPERT_GEMM_V5_PERSIST=$p GPTOSS_BENCH_V5_KPERM_ONLY=1 timeout 90 $g bench-kernels --model $m --tokens $tk --iters 5 > $out/bk.txt 2>&1
  grep -E "gate_up \+ down.*v5.*kperm" $out/bk.txt | grep -E "wg4" | sed -E 's/^\| experts gate_up \+ down \| [^|]*\| //' >> $S
done; done
ts prefill
for m in 120b 20b; do for p in 1 0 1 0; do
  echo "== $m PERSIST=$p" >> $S
  GPTOSS_EXPERT_GEMM_V5_PERSIST=$p timeout 100 $g bench --device cuda --random-weights $m --pp 2048,4096,8192 --tg '' --runs 1 2>&1 | grep -E "^\| random" >> $S
done; done
ts tests
t model 200 $bin/test_cuda_model
t k 230 $K --gtest_filter='Kernels.MoeMxfp4ExpertGemmV5:ExpertGemmV5Width.*'
ts done
