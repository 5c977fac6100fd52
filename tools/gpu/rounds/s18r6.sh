# Session 18, round 6: the prefill token budget under load. serve's --max-num-batched-tokens 2048
# (the default), 4096 and 8192 at 32 and 64 streams (20b), 2048 and 8192 (120b); the passes' split
# between prefill and decode from the GPU timeline.
source tools/gpu/rounds/prelude.sh
for mb in "20b 2048" "20b 4096" "20b 8192" "120b 2048" "120b 8192"; do
  set -- $mb; m=$1; b=$2
  ts $m budget $b; serve_cs $m --max-num-batched-tokens $b -- 32 64
done
ts done
rm -f $out/*.log
cat $S
