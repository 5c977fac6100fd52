# Session 49, round 2 (after s49r1; any GPU, an H200 for issue 14's figures): the 32- and
# 64-sequence steps with the default walk's ring in shared memory (GPTOSS_WALK_RING=12 / 14 / 8,
# cp.async; 0 = the register ring, the default), alternating, 120b bf16 tg128; then, on an H200,
# serving at 32 and 64 streams with the best ring against the default.
# Pack: PACK_TESTS= (gptoss only)
source tools/gpu/rounds/prelude.sh
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $S
for x in 32 64; do
  for i in 1 2; do
    for r in 0 12 14 8; do
      left 300 && GPTOSS_WALK_RING=$r RUNS=1 b "ring $r" $g 120b 128 $x
    done
  done
done
ts "step A/B done"
if [[ $name == *H200* ]]; then
  best=$(awk '/^== ring/{r=$3} /tg128 x64/{split($0,f,"|"); v=f[6]+0; s[r]+=v; n[r]++} END{b=0; bv=0; for (k in s) if (s[k]/n[k] > bv) {bv=s[k]/n[k]; b=k}; print b}' $S)
  ts "best ring at x64: $best"
  for r in 0 $best; do
    left 420 && { ts "serving, GPTOSS_WALK_RING=$r"; GPTOSS_WALK_RING=$r serve_cs 120b -- 32 64; }
  done
fi
ts done
