#!/usr/bin/env bash
# A diagnostic copy of gptoss: one source file compiled again with extra defines, the rest of
# build/ as it is, linked to build/diag/gptoss_NAME. For timing ceilings (what a kernel would take
# without a part of its work): the GPTOSS_DIAG_* hooks in the kernels compute garbage on purpose,
# so only bench-kernels' per-kernel rows (fixed routing, the same bytes) mean anything with such a
# binary; a whole step's routing, and with it its bytes, changes. docs/BENCHMARKS.md, twenty-sixth
# session, has the hooks' measurements.
#
#   tools/gpu/diag_binary.sh NAME SOURCE DEFINE...
#   tools/gpu/diag_binary.sh no_scale_math src/backend/cuda/kernels/linear/skinny_units.cu GPTOSS_DIAG_SCALE_NO_MATH
#
# Needs build/ configured (Ninja) with gptoss built. Carry the result to the GPU machine beside
# the main binary (.gpu-carry-pack/pack.sh: EXTRA_BINS=build/diag/gptoss_NAME).
set -euo pipefail
[ $# -ge 3 ] || { sed -n '2,13p' "$0"; exit 2; }
name=$1 src=$2; shift 2
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$root/build out=$root/build/diag/$name
mkdir -p "$out"
rel=${src#"$root"/}
cmds=$(ninja -C "$build" -t commands gptoss)
# The object's compile command (ninja's depfile flags dropped), then the archive that holds it.
compile=$(grep -F -- "-c $root/$rel -o" <<<"$cmds" | head -1) || true
[ -n "$compile" ] || { echo "no compile command for $rel in build/"; exit 1; }
obj=$(sed -E 's/.* -o ([^ ]+)$/\1/' <<<"$compile")
archive=$(grep -E "ar qc [^ ]+ .*$obj" <<<"$cmds" | head -1 | sed -E 's/.*ar qc ([^ ]+) .*/\1/') || true
[ -n "$archive" ] || { echo "no archive holds $obj"; exit 1; }
defs=""
for d in "$@"; do defs="$defs -D$d"; done
compile=$(sed -E 's/ -MD -MT [^ ]+ -MF [^ ]+//' <<<"$compile")
compile=${compile/ -o $obj/ -o $out/$(basename "$obj")}
(cd "$build" && eval "${compile/ -c / $defs -c }")
cp "$build/$archive" "$out/lib.a"
ar r "$out/lib.a" "$out/$(basename "$obj")"
link=$(tail -1 <<<"$cmds")
link=${link//$archive/$out/lib.a}
link=${link/ -o gptoss / -o $root/build/diag/gptoss_$name }
(cd "$build" && eval "$link")
strip "$root/build/diag/gptoss_$name"
echo "build/diag/gptoss_$name ($rel with$defs)"
