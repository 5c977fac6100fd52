# Session 32, call 2: pipelined greedy steps (Backend::launch_greedy: step N + 1 launched with its
# tokens copied on the device from step N's ids, `bench`'s tg default now) against the
# synchronous loop (--sync-steps); the model tests with the two new pipelined ones; a trace of the
# pipelined one-token step for the gap between replays.
# Pack: EXTRA_BINS="build/libgptoss_kernel_trace.so" PACK_TESTS="test_cuda_model" tools/gpu/pack.sh
source tools/gpu/rounds/prelude.sh
M=$bin/test_cuda_model
ts start
t model 200 $M
ts benches
for rep in 1 2; do
  for f in "--dense-dtype fp8" "" "--mxfp4-layers all"; do
    b pipe $g 120b 128 1 $f; b sync $g 120b 128 1 $f --sync-steps
  done
done
for f in "--dense-dtype fp8" "" "--mxfp4-layers all"; do
  b pipe $g 20b 128 1 $f; b sync $g 20b 128 1 $f --sync-steps
done
b pipe $g 120b 32 4,8,32,64 --dense-dtype fp8; b sync $g 120b 32 4,8,32,64 --dense-dtype fp8 --sync-steps
b pipe $g 120b 32 8,32,64; b sync $g 120b 32 8,32,64 --sync-steps
echo "== trace pipelined" >> $S
CUDA_INJECTION64_PATH=$bin/libgptoss_kernel_trace.so KERNEL_TRACE_OUT=$out/trace_pipe.csv timeout 100 $g bench --device cuda \
  --random-weights 120b --dense-dtype fp8 --pp '' --tg 32 --batch 1 --runs 1 2>&1 | grep -E "^\| random|rror|kernel_trace" >> $S
python3 tools/gpu/kernel_trace_report.py $out/trace_pipe.csv > $out/report_pipe.txt 2>&1; head -4 $out/report_pipe.txt >> $S
python3 - $out/trace_pipe.csv >> $S <<'PY'
import csv, collections, statistics, sys
reps = collections.defaultdict(list)
for r in csv.DictReader(open(sys.argv[1])):
    if r['graph_id'] != '0': reps[(r['graph_id'], int(r['correlation']))].append(r)
g = collections.Counter(k[0] for k in reps).most_common(1)[0][0]
keys = sorted(k for k in reps if k[0] == g)
gaps = [min(int(x['start_ns']) for x in reps[b]) - max(int(x['end_ns']) for x in reps[a]) for a, b in zip(keys, keys[1:])]
print('gap between replays, us: median %.1f, min %.1f, max %.1f' % (statistics.median(gaps) / 1e3, min(gaps) / 1e3, max(gaps) / 1e3))
PY
gzip -f $out/trace_pipe.csv
ts done
