source tools/gpu/rounds/prelude.sh
ts tests
t k 200 $K --gtest_filter='Kernels.ExpertGemmV5Preferred:Kernels.MoeMxfp4ExpertGemmV5:Kernels.MoeMxfp4Fragments:Kernels.AttentionDecodeStored*'
t model 200 $bin/test_cuda_model
ts pp-tg
for m in 20b 120b; do
  timeout 120 $g bench --device cuda --random-weights $m --pp 512,2048,8192 --tg 64 --batch 1,8,32,64 --runs 2 2>&1 | grep -E "^\| random" >> $S
done
ts serve
srv 18100 20b -- 32 64
srv 18101 120b -- 32 64
ts ncu
timeout 200 ncu --clock-control none --kernel-name-base demangled -k "regex:expert_gemm_wa_kernel" --launch-skip 0 --launch-count 1 --set full --import-source yes -o $out/wa $g bench-kernels --model 120b --tokens 2048 --iters 2 > $out/ncu_run.txt 2>&1; echo "ncu rc=$?" >> $S
ncu -i $out/wa.ncu-rep --page details > $out/wa_details.txt 2>&1
grep -E "Duration|Issue Slots Busy|Eligible Warps|Executed Instructions  |Registers Per" $out/wa_details.txt | head -8 >> $S
ncu -i $out/wa.ncu-rep --page source --print-source sass --csv > $out/wa_sass.csv 2>&1; xz -6 $out/wa_sass.csv; rm -f $out/wa.ncu-rep
ts done
cat $S
