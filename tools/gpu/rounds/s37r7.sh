# Session 37, round 7 (run inline, right after s37r6 on the same machine): serving 120b at 64
# streams with the split tiling off and on, for the prefill passes' time.
# Pack: tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
for sp in 0 1; do echo "== SPLIT=$sp" >> $S; GPTOSS_EXPERT_GEMM_V5_SPLIT=$sp srv 1811$sp 120b -- 64; done
cat $S
