# Session 37, round 6: serving on HEAD (the split tiling is the prefill default): 120b at 32 and 64
# streams, 512 in / 256 out, with the timeline.
# Pack: tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
srv 18100 120b -- 32 64
ts done
