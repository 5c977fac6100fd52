# Session 45, round 2: check.sh's test parts on main's binaries, split as s27r2 / s27r3 did so that
# each call ends within its limit: this round the kernel tests but attention's, the model and the
# speculation tests; s45r3 the attention half and memcheck.
source tools/gpu/rounds/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
ts tests
t kernels 400 $K --gtest_filter='-Kernels.Attention*:Kernels.Flash*:Kernels.*WarpSpecialized*'
left 450 && t model 120 $bin/test_cuda_model
left 540 && t spec 50 $bin/test_cuda_spec
ts done
