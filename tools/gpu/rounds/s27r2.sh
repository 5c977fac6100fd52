# Session 27, round 2: is the warp walk's 75% of DRAM peak its occupancy's? The walk's plain-read
# pattern at its own 16 warps an SM (mode 7) and at 8 (mode 8) beside the unrestricted one (mode 5);
# the one-token dense layers in bf16, fp8 and MXFP4 (bench-kernels' new MXFP4 rows); then main's
# binaries: check.sh's test parts but the attention half (that and memcheck: s27r3).
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model test_cuda_spec" bash .gpu-carry-pack/pack.sh
source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
for mt in 120b:64 120b:8 20b:64 120b:1; do
  m=${mt%:*}; tok=${mt#*:}
  timeout 60 $g bench-kernels --model $m --tokens $tok --iters 100 > $out/bk_${m}_$tok.md 2>&1
  echo "== $m tokens $tok" >> $S
  grep -E "plain read.*(walk|weights \+ scales \|)|\(fragments\) \||skinny_mma (bf16|fp8) \||mxfp4-layers|attention.*(plan|default)|router.*default|combine.*default" $out/bk_${m}_$tok.md >> $S
done
ts tests
t kernels 360 $K --gtest_filter='-Kernels.Attention*:Kernels.Flash*'
t model 150 $bin/test_cuda_model
t spec 60 $bin/test_cuda_spec
ts done
cat $S
