# Session 27, round 4 (branch s27-mxfp4-stage): the dense MXFP4 decode kernels (--mxfp4-layers) stage
# their first chunk groups and those chunks' scale words in shared memory before
# griddepcontrol.wait, as the bf16 and fp8 decode copies do: SkinnyDense at the small shapes
# (the staged qkv and o_proj ones among them), then bench-kernels' one-token dense rows.
# Pack: PACK_TESTS="test_cuda_kernels" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
GPTOSS_TEST_SMALL=1 t dense_small 60 $K --gtest_filter='Kernels.SkinnyDense'
t dense 90 $K --gtest_filter='Kernels.SkinnyDense'
timeout 60 $g bench-kernels --model 120b --tokens 1 --iters 100 > $out/bk_120b_1.md 2>&1
grep -E "skinny_mma (bf16|fp8) \||mxfp4-layers" $out/bk_120b_1.md >> $S
ts done
cat $S
