set -uo pipefail
bin=$PWD/.gpu-carry; out=$OUT
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib" GPTOSS_TEST_DATA_DIR="$bin/data" GPTOSS_TIKTOKEN="$bin/o200k_base.tiktoken"
g=$bin/gptoss; K=$bin/test_cuda_kernels
T0=$SECONDS; ts() { echo "[t=$((SECONDS-T0))s] $*"; }
t() { local name=$1 to=$2; shift 2; timeout $to "$@" --gtest_color=no > $out/$name.log 2>&1; echo "$name rc=$?"; grep -E "^\[  FAILED|PASSED|Failure|exception" $out/$name.log | head -6; }
ts tests
t k 300 $K --gtest_filter='Kernels.MoeMxfp4Fragments*:Kernels.SkinnyDense*:Kernels.StreamK*:Kernels.Expert*:Kernels.Router*:Kernels.MoeCombine*:Kernels.MoeRoute*:Kernels.LinearRmsNorm'
timeout 200 compute-sanitizer --tool memcheck $K --gtest_filter='Kernels.MoeMxfp4FragmentsDecode' > $out/memcheck.log 2>&1; echo "memcheck rc=$?"; grep -E "ERROR SUMMARY" $out/memcheck.log | head -2
t m 240 $bin/test_cuda_model
t spec 120 $bin/test_cuda_spec
t eagle 120 $bin/test_cuda_eagle3
ts bench-kernels
timeout 120 $g bench-kernels --model 120b --tokens 1 --iters 50 > $out/bk1.txt 2>&1; grep -E "skinny_mma|experts gate_up \(mxfp4\)|experts down \(mxfp4\)|plain read|router|combine \| 1x2880 \| default" $out/bk1.txt | grep -v "streamk\|ks16 rt2 pf3\|ks16 rt1 pf4\|ks4 \|ks=4" | head -40
for m in 120b 20b; do ts "bench $m"; timeout 100 $g bench --device cuda --random-weights $m --pp 2048 --tg 64 --batch 1,32,64 --runs 2 2>&1 | grep -E "^\| random"; done
ts "fp8 / mxfp4 dense"
timeout 90 $g bench --device cuda --random-weights 120b --dense-dtype fp8 --pp '' --tg 64 --runs 2 2>&1 | grep -E "^\| random"
timeout 90 $g bench --device cuda --random-weights 120b --mxfp4-layers all --pp '' --tg 64 --runs 2 2>&1 | grep -E "^\| random"
timeout 90 $g bench --device cuda --random-weights 20b --dense-dtype fp8 --pp '' --tg 64 --runs 2 2>&1 | grep -E "^\| random"
timeout 90 $g bench --device cuda --random-weights 20b --mxfp4-layers all --pp '' --tg 64 --runs 2 2>&1 | grep -E "^\| random"
srv() {  # model concurrency...
  local m=$1; shift
  GPTOSS_CUDA_TIMELINE=1 $g serve --device cuda --random-weights $m --port 18100 --max-model-len 8192 --max-num-seqs 64 > $out/serve_$m.log 2>&1 &
  local pid=$!
  for _ in $(seq 120); do curl -sf localhost:18100/health >/dev/null && break; sleep 1; done
  for c in "$@"; do ts "serve $m $c streams"; timeout 120 $g bench-serve --base-url http://127.0.0.1:18100 --requests $((c * 2)) --concurrency $c --input-len 512 --output-len 256 --ignore-eos 2>&1 | grep -E "^TTFT|^TPOT|^aggregate|first error"; done
  kill -INT $pid; wait $pid; grep -E "cuda timeline" $out/serve_$m.log
}
srv 20b 32 64
srv 120b 32
ts done
