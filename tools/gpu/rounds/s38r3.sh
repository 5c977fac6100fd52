# Session 38, round 3: eager passes in chunks of 8192 tokens on an H200 (max_chunk_, from a fixed
# 4096), so a serving prefill pass (budget 8192) runs as one chunk; with round 2's per-token
# attention range. The model tests (ChunkedPassMatchesCpu cuts passes at 37 tokens); prefill
# passes of 8192 tokens, HEAD's binary (gptoss_base) against this one; serving 120b at 32 and 64
# streams twice each, 20b once.
# Pack: EXTRA_BINS=/tmp/bb/gptoss_base PACK_TESTS=test_cuda_model tools/gpu/pack.sh
#   (gptoss_base: HEAD 29d821b's gptoss, built in a worktree)
source tools/gpu/rounds/prelude.sh
ts tests
t model 300 $bin/test_cuda_model
ts prefill
for m in 120b 20b; do
  for gb in gptoss_base gptoss gptoss_base gptoss; do
    echo "== $m $gb" >> $S
    for pb in 8192:1 512:16 1024:8; do
      timeout 120 $bin/$gb bench --device cuda --random-weights $m --pp ${pb%:*} --pp-batch ${pb#*:} --tg '' --runs 2 2>&1 |
        grep -E "^\| random" >> $S
    done
  done
done
for i in 1 2; do
  g=$bin/gptoss_base srv $((18100 + 2 * i)) 120b -- 32 64
  srv $((18101 + 2 * i)) 120b -- 32 64
done
g=$bin/gptoss_base srv 18110 20b -- 32 64
srv 18111 20b -- 32 64
ts done
