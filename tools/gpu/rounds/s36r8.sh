# Session 36, call 8: serving on HEAD (issue 14's runs): 120b and 20b, 32 and 64 streams, 512 in /
# 256 out, 2C requests; the timeline line of each server.
# Pack: tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
serve_cs 120b -- 32 64
serve_cs 20b -- 32 64
ts done
