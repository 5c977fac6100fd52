# Session 38, round 1 (prepared in the thirty-seventh session, not yet run): where serving's
# prefill passes lose ~18% a token against bench's pp4096 (s37r6: 36.9-39.2 us a token in serve's
# timeline; s37r4: pp4096 31.2). The server's shape of pass alone (`--pp-batch`: 8 prompts of 512
# in one pass, and 4 of 1024, 2 of 2048) beside one prompt of the same total, then serving at
# 32 and 64 streams with the default token budget (8192) and with 4096.
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
srv 18100 120b -- 32 64
# The CUDA backend runs an eager pass in chunks of at most 4096 tokens (kMaxChunk), so a pass of
# 4097-8192 tokens (the budget) runs a second, smaller chunk that reads every expert's weights
# again; a budget of 4096 never cuts a pass so.
srv 18101 120b --max-num-batched-tokens 4096 -- 32 64
ts done
