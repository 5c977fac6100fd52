# Session 38, round 1 (prepared in the thirty-seventh session, not yet run): where serving's
# prefill passes lose ~18% a token against bench's pp4096 (s37r6: 36.9-39.2 us a token in serve's
# timeline; s37r4: pp4096 31.2). The server's shape of pass alone (`--pp-batch`: 8 prompts of 512
# in one pass, and 4 of 1024, 2 of 2048) beside one prompt of the same total, then a traced
# serve at 64 streams for the prefill passes' kernels.
# Pack: tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
ts "pp-batch"
for m in 120b 20b; do
  echo "== $m" >> $S
  # (passes of at most 4096 tokens, as the server's are)
  for pb in 512:1,4,8 1024:1,2,4 2048:1,2 4096:1; do
    timeout 120 $g bench --device cuda --random-weights $m --pp ${pb%:*} --pp-batch ${pb#*:} --tg '' --runs 2 2>&1 |
      grep -E "^\| random" >> $S
  done
done
ts serve
srv 18100 120b -- 64
ts done
