# Session 20, round 6 (run as one device command; written out here): serving on the final
# defaults (rt6 units, cp.async staging) and with both turned off, same machine and call.
source tools/gpu/rounds/prelude.sh
for cfg in "1 1" "0 0"; do
  set -- $cfg
  export GPTOSS_UNITS_RT6=$1 GPTOSS_STAGE_ASYNC=$2
  ts serve 20b rt6=$1 stage_async=$2; serve_cs 20b -- 32 64
  ts serve 120b rt6=$1 stage_async=$2; serve_cs 120b -- 32 64
done
ts done
rm -f $out/*.log
cat $S
