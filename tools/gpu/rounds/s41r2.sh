# Session 41, round 2: the expert decode kernels read their weights past L1 by default
# (skinny_units.cu: kExpertWeightLoad = L1::no_allocate; s39r4 measured +0.4-0.7% a step with a
# diagnostic copy), and forward_sample's kept rows through pinned staging (s41r1: one request in 8
# with presence_penalty cost 120b at 32 streams 2242 -> ~1680 tok/s with kept rows, 1417 without;
# the engine's gap between passes 3.2 ms). Tests of the expert decode kernels (against the CPU and
# the block-per-tile kernel) and of the kept rows; decode steps against s39r4's HEAD rows; serving
# 120b at 32 streams plain and mixed.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model test_cuda_spec" EXTRA_BINS=build/tests/engine/bench_engine_host tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
ts "the engine's host time a step on this host (fake 12 ms passes, 32 clients; plain, then 1 in 8 penalized)"
for pe in 0 8; do timeout 60 $bin/bench_engine_host 32 12000 128 1 $pe >> $S 2>&1; done
ts tests
t moe 200 $K --gtest_filter='Kernels.MoeMxfp4:Kernels.MoeMxfp4Fragments*:Kernels.SkinnyUnits*'
t model 200 $bin/test_cuda_model --gtest_filter='*BatchedDecode*:*GraphReplay*'
t spec 120 $bin/test_cuda_spec --gtest_filter='*VerifyPassRows*'
ts "steps (s39r4 HEAD: 517.7, 3612.1, 11251.3)"
b units_no_l1 $g 120b 128 1
b units_no_l1 $g 120b 128 64
b units_no_l1 $g 20b 128 64
ts "serve 120b"
serve_up 120b
mixed "plain c32"
mixed "1 in 8 with presence_penalty, c32" --extra-body '{"presence_penalty": 0.5}' --extra-body-every 8
serve_down
ts done
