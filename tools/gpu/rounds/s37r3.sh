# Session 37, round 3: version 5's split tiling (whole tiles of one width, each expert's remainder
# in one narrower tile of a second launch that fills the first one's last wave;
# GPTOSS_EXPERT_GEMM_V5_SPLIT=1) against one width (=0): bench-kernels' v5 rows (the automatic
# tiling beside each single width), the model's prefill alternating, then the version 5 tests
# (single widths at both CTA shapes, forced splits) and the host tests of the choice.
# Pack: PACK_TESTS="test_cuda_kernels" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
ts bench-kernels
for mt in 120b:4096 120b:2048 20b:1024 20b:2048; do bk_v5 "${mt/:/ }" ${mt%:*} ${mt#*:}; done
ts prefill
pp_ab GPTOSS_EXPERT_GEMM_V5_SPLIT "0 1" 512,1024,2048,4096,8192 120b 20b
ts tests
t k 230 $K --gtest_filter='Kernels.MoeMxfp4ExpertGemmV5:ExpertGemmV5Width.*'
ts done
