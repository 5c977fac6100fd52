# Prepared in session 19 for the next GPU session (not run): s19r6 (the sharpened
# CudaModel.GraphReplayAfterPageTableGrowth must fail on a binary with the metadata bug and pass
# on main), then every cuda test (the routers changed in 4807a2f; their
# tests and memcheck ran in s19r2, the whole kernel suite has not run since the seventeenth session).
# Before packing, build the binary with the bug here:
#   git show 4807a2f:src/backend/cuda/cuda_backend.cpp > src/backend/cuda/cuda_backend.cpp
#   cmake --build build --target test_cuda_model && cp build/tests/cuda/test_cuda_model /tmp/test_cuda_model_bug
#   git checkout src/backend/cuda/cuda_backend.cpp && cmake --build build --target gptoss test_cuda_kernels test_cuda_model test_cuda_spec
#   xz -c /tmp/test_cuda_model_bug > .gpu-carry-pack/test_cuda_model_bug.xz
#   PACK_TESTS="test_cuda_kernels test_cuda_model test_cuda_spec" bash .gpu-carry-pack/pack.sh
# Expected ~8-9 minutes (the kernel suite ~7): give it the whole 600 s call.
source tools/gpu/rounds/prelude.sh
xz -dc .gpu-carry-pack/test_cuda_model_bug.xz > $bin/test_cuda_model_bug; chmod +x $bin/test_cuda_model_bug
t model_test_with_bug 120 $bin/test_cuda_model_bug --gtest_filter='CudaModel.GraphReplayAfterPageTableGrowth'
grep -E "seq (5|6|30|31|32):" $out/model_test_with_bug.log | head -5 >> $S
ts check.sh
bash tools/gpu/check.sh --prebuilt $bin --no-bench --no-sanitizer 2>&1 | tail -12 >> $S
ts done
cat $S
