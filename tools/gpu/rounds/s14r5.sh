source tools/gpu/rounds/prelude.sh
ts check
OUT=$out/check bash tools/gpu/check.sh --prebuilt .gpu-carry --no-bench --no-sanitizer > $out/check.txt 2>&1
echo "check rc=$?" >> $S; grep -E "PASSED|FAILED|rc=|passed|failed" $out/check.txt | tail -12 >> $S
t eagle 100 $bin/test_cuda_eagle3
ts tg
for m in 120b 20b; do
  timeout 150 $g bench --device cuda --random-weights $m --pp 512,2048,8192 --tg 128 --batch 1,8,32,64 --runs 2 2>&1 | grep -E "^\| random" >> $S
done
ts serve
srv 18100 20b -- 32 64
srv 18101 120b -- 32 64
ts done
cat $S
