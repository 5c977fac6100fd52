source tools/gpu/rounds/prelude.sh
ts check
OUT=$out/check timeout 580 tools/gpu/check.sh --prebuilt .gpu-carry --no-bench --no-sanitizer > $out/check.txt 2>&1
echo "check rc=$?" >> $S
tail -6 $out/check.txt >> $S
grep -h -E "^\[  FAILED" $out/check/*.log | head >> $S
ts done
cat $S
