# Session 37, round 4: the final split-tiling rule (only the 128-pair mbarrier kernel is split,
# remainder tiles costed as measured in s37r3): the model's prefill alternating with
# GPTOSS_EXPERT_GEMM_V5_SPLIT=0, the model tests, compute-sanitizer over the version 5 test's small
# cases (forced splits included), bench-kernels' automatic rows at 4096 and 8192 tokens.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
ts prefill
pp_ab GPTOSS_EXPERT_GEMM_V5_SPLIT "1 0" 2048,4096,8192 120b 20b
ts bench-kernels
for mt in 120b:8192 20b:4096; do bk_v5 "${mt/:/ }" ${mt%:*} ${mt#*:} "n128 kperm|auto"; done
ts model tests
t model 200 $bin/test_cuda_model
ts sanitizer
sanitize 'Kernels.MoeMxfp4ExpertGemmV5' memcheck racecheck synccheck
ts done
