# Session 19, round 4: serving at 32 and 64 streams on main with padding tokens taking no expert
# pair (4807a2f), against GPTOSS_ROUTE_PADDING=1 (routed, as before) in the same round: s19r3's
# 20b 64-stream run gave 8393 tok/s against 6946-7010 in the eighteenth session's rounds.
# `serve --device cuda --random-weights M --max-model-len 8192 --max-num-seqs 64`, `bench-serve
# --requests 2C --concurrency C --input-len 512 --output-len 256 --ignore-eos`.
source tools/gpu/rounds/prelude.sh
for m in 20b 120b; do
  for pad in 0 1 0; do
    [ $m = 120b ] && [ $pad = 0 ] && [ -n "${did120:-}" ] && continue
    ts serve $m GPTOSS_ROUTE_PADDING=$pad; export GPTOSS_ROUTE_PADDING=$pad
    serve_cs $m -- 32 64
    [ $m = 120b ] && did120=1
  done
done
ts done
rm -f $out/*.log
cat $S
