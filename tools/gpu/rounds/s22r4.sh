# Session 22, fourth round: o_proj alone on its skinny decode copy at 17-32 tokens (qkv and
# lm_head on cuBLASLt), GPTOSS_OPROJ_SKINNY_MAX=0|32, in the step; bench-kernels had the skinny
# kernel faster alone (120b o_proj at 32 tokens 11.19 us against cuBLASLt 14.81, s22r2) where the
# eleventh session found the step faster on cuBLASLt.
# GPTOSS_OPROJ_SKINNY_MAX was a measurement knob in cuda_backend.cpp's run_pass for this round
# (o_proj's decode copy up to N tokens); not on main.
source tools/gpu/rounds/prelude.sh
for r in 1 2; do
  for m in 20b 120b; do
    for o in 0 32; do
      ts step $m oproj_skinny_max $o
      GPTOSS_OPROJ_SKINNY_MAX=$o timeout 100 $g bench --device cuda --random-weights $m --pp '' --tg 32 --batch 17,24,32 --runs 1 2>&1 | grep -E "^\|.*tg" >> $S
    done
  done
done
ts done
cat $S
