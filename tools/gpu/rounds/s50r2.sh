# Session 50, round 2 (after s50r1; an H200 for issue 14's figures): 120b serving at 32 and 64
# streams (512 in / 256 out, 2C requests, random weights, bf16 dense) with the default walk's ring
# in registers (GPTOSS_WALK_RING=0) and in shared memory at the depth s50r1 found best ($1), each
# server in turn, then the 32- and 64-sequence step once more with each.
#   bash tools/gpu/rounds/s50r2.sh RING
# Pack: as s50r1 (gptoss is all it uses).
source tools/gpu/rounds/prelude.sh
best=${1:-12}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
for r in 0 $best; do
  left 330 && { ts "serving, GPTOSS_WALK_RING=$r"; GPTOSS_WALK_RING=$r serve_cs 120b -- 32 64; }
done
for r in 0 $best; do
  left 500 && GPTOSS_WALK_RING=$r RUNS=1 b "ring $r" $g 120b 128 32,64
done
ts done
