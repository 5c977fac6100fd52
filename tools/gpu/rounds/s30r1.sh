# (Ran the binaries of branch s30-l2-prefetch: GPTOSS_L2_PREFETCH exists there only.)
# Session 30, call 1 (binaries of branch s30-l2-prefetch: main after session 29's review plus the
# L2-prefetch experiment, off unless GPTOSS_L2_PREFETCH is set).
# 1. The review's fold kernels (moe_sort_warp into shared memory, not run on a GPU before): their
#    kernel tests (one and 2-8 tokens, padding) and the decode routers', memcheck.
# 2. The experiment: dense weights pulled into L2 from a side branch of the graph while DRAM idles
#    (o: o_proj's through qkv and attention; q: the next qkv's through down; Q: from gate_up on),
#    120b fp8 tg64 x1, alternating with the prefetch off.
# Pack: PACK_TESTS="test_cuda_kernels test_cuda_model" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
ts tests
t fold 240 $K --gtest_filter='Kernels.RouterFoldedIntoOproj*:Kernels.RouterRoute*'
grep -cE "router fold" $out/fold.log >> $S
GPTOSS_TEST_SMALL=1 timeout 150 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.RouterFoldedIntoOproj*' > $out/memcheck.log 2>&1
echo "memcheck rc=$?" >> $S; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/memcheck.log | head -3 >> $S
ts prefetch
pf() {  # NAME ENV... : one tg64 x1 run of 120b fp8
  local name=$1; shift
  echo "== $name" >> $S
  env "$@" timeout 100 $g bench --device cuda --random-weights 120b --dense-dtype fp8 --pp '' --tg 64 --batch 1 \
    --runs 2 2>&1 | grep -E "^\| random|rror" >> $S
}
pf off X=0
pf o GPTOSS_L2_PREFETCH=o
pf q GPTOSS_L2_PREFETCH=q
pf oq GPTOSS_L2_PREFETCH=oq
pf off X=0
pf oq_lines GPTOSS_L2_PREFETCH=oq GPTOSS_L2_PREFETCH_MODE=lines
pf oQ_last GPTOSS_L2_PREFETCH=oQ GPTOSS_L2_PREFETCH_MODE=last
pf oq_b64 GPTOSS_L2_PREFETCH=oq GPTOSS_L2_PREFETCH_BLOCKS=64
pf off X=0
ts done
cat $S
