# Session 21, seventh round (run inline on s21r6's warm machine, same binaries): variant 26 (the
# warp walk with 16-token passes, ring 6) against the default at 20b x56 / x64, twice, then serving
# 20b at 64 streams with it forced on every grouped launch.
source tools/gpu/rounds/prelude.sh
for v in 0 26 0 26; do
  ts step 20b variant $v
  GPTOSS_SKINNY_VARIANT=$v timeout 40 $g bench --device cuda --random-weights 20b --pp '' --tg 32 --batch 56,64 --runs 1 2>&1 | grep -E "^\|.*tg" >> $S
done
for v in 0 26; do ts serve 20b variant $v; GPTOSS_SKINNY_VARIANT=$v serve_cs 20b -- 64; done
cat $S
