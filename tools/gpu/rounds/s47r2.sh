# Session 47, round 2: the final commit's GPU check (the pair kernel removed, the knobs of s47r1
# dropped): check.sh's test parts but the attention half (its kernels' code unchanged since
# 0dfa734, tested in s46r0), memcheck over the kernel tests at small shapes, then tg128 x1 on
# this binary for the record.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model test_cuda_spec"
source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
t kernels 330 $K --gtest_filter='-Kernels.Attention*:Kernels.Flash*:Kernels.*WarpSpecialized*'
t model 150 $bin/test_cuda_model
t spec 90 $bin/test_cuda_spec
ts "memcheck"
left 330 && sanitize '-Kernels.*WarpSpecialized*:Kernels.Attention*:Kernels.Flash*' memcheck
ts "tg128 x1"
for args in "120b --dense-dtype fp8" "120b" "20b --dense-dtype fp8" "120b --mxfp4-layers all"; do
  set -- $args; m=$1; shift
  left 560 && RUNS=2 b "head" $g $m 128 1 "$@"
done
ts done
