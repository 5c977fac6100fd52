set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; S=$out/summary.txt
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*" >> $S; }
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
ts "ncu dense"
timeout 200 $NCU --clock-control none --kernel-name-base demangled -k "regex:skinny_mma_kernel" --launch-skip 400 --launch-count 3 --set full --import-source yes -o $out/dense $g bench --device cuda --random-weights 120b --pp '' --tg 8 --batch 1 --runs 1 > $out/ncu_dense.log 2>&1; echo "rc=$?" >> $S
ts "ncu units"
timeout 200 $NCU --clock-control none --kernel-name-base demangled -k "regex:skinny_units_kernel" --launch-skip 400 --launch-count 2 --set full --import-source yes -o $out/units $g bench --device cuda --random-weights 120b --pp '' --tg 8 --batch 1 --runs 1 > $out/ncu_units.log 2>&1; echo "rc=$?" >> $S
for f in dense units; do
  $NCU --import $out/$f.ncu-rep --page details --csv > $out/${f}_details.csv 2>&1
  $NCU --import $out/$f.ncu-rep --page source --print-source sass --csv > $out/${f}_sass.csv 2>&1
  rm -f $out/$f.ncu-rep
done
ls -la $out >> $S
tail -3 $out/ncu_dense.log >> $S
ts done
cat $S
