# Session 37, round 4: the final split-tiling rule (only the 128-pair mbarrier kernel is split,
# remainder tiles costed as measured in s37r3): the model's prefill alternating with
# GPTOSS_EXPERT_GEMM_V5_SPLIT=0, the model tests, compute-sanitizer over the version 5 test's small
# cases (forced splits included), bench-kernels' automatic rows at 4096 and 8192 tokens.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
ts prefill
for m in 120b 20b; do for sp in 1 0 1 0; do
  echo "== $m SPLIT=$sp" >> $S
  GPTOSS_EXPERT_GEMM_V5_SPLIT=$sp timeout 100 $g bench --device cuda --random-weights $m --pp 2048,4096,8192 --tg '' --runs 1 2>&1 | grep -E "^\| random" >> $S
done; done
ts bench-kernels
for mt in 120b:8192 20b:4096; do
  m=${mt%:*}; tk=${mt#*:}
  echo "== $m $tk" >> $S
  GPTOSS_BENCH_V5_KPERM_ONLY=1 timeout 90 $g bench-kernels --model $m --tokens $tk --iters 5 > $out/bk.txt 2>&1
  grep -E "gate_up \+ down.*v5.*(n128 kperm|auto)" $out/bk.txt | sed -E 's/^\| experts gate_up \+ down \| [^|]*\| //' >> $S
done
ts model tests
t model 200 $bin/test_cuda_model
ts sanitizer
sanitize 'Kernels.MoeMxfp4ExpertGemmV5' memcheck racecheck synccheck
ts done
