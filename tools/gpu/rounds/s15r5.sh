# Session 15, round 5: round 4's script again, on branch s15-l2-prefetch's binaries with mode 3
# excluding lm_head (W.N <= 8192).
exec bash tools/gpu/rounds/s15r4.sh
