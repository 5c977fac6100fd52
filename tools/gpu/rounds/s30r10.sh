# Session 30, call 10 (main, d618f21's sources): serving 20b at 32 and 64 streams and 120b with fp8
# dense layers at 32 and 64 (issue 14's table), with the one-token fixes of this session.
# Pack: PACK_TESTS="" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
ts serve20b
serve_cs 20b -- 32 64
ts serve120b_fp8
serve_cs 120b --dense-dtype fp8 -- 32 64
ts done
cat $S
