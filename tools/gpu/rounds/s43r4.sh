# Session 43, round 4: compute-sanitizer over the lm_head screen's kernel tests (small cases:
# memcheck, racecheck, synccheck), and the dense decode kernels' test, which re-checks the fp8
# packer (its byte loop now shared with the screen's int8 one, aa7ce87). Nsight Compute: s43r5.
source tools/gpu/rounds/prelude.sh
t skinny 200 $K --gtest_filter='Kernels.SkinnyDense'
sanitize 'Kernels.LmHeadScreen*' memcheck racecheck synccheck
ts done
