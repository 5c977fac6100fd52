#!/usr/bin/env bash
# Mutation check, by hand (not part of the suite): applies each edit of mutations.txt, one at a
# time, to a scratch copy of this checkout, builds it CPU-only (ccache) and runs the CPU test
# suite; an edit the suite still passes SURVIVED (a gap in the tests), one it fails is KILLED.
#
#   tools/mutation/run.sh [-R CTEST_REGEX] [-E CTEST_REGEX] [-k] [MUTATION_NAME...]
#     -R REGEX   run only the ctest tests matching REGEX (default: every test labelled cpu)
#     -E REGEX   leave out the tests matching REGEX (e.g. e2e_concurrency, the slowest)
#     -k         keep the scratch copy (printed at the end; MUTATION_DIR=it reuses it)
#   Exit status: 0 when every mutation is killed, 1 when one survived or went stale.
#
# The scratch copy (tracked + untracked, not ignored, files of the working tree) lives in
# build-mutation.*/ of this checkout; one build directory is reused, so each mutation recompiles only what its
# edit touches. Needs what scripts/setup.sh installs (node and tests/e2e/node_modules for the
# e2e tests: linked from this checkout).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
list="$here/mutations.txt"
regex="" exclude="" keep=0
while getopts "R:E:k" o; do
  case $o in
    R) regex=$OPTARG ;;
    E) exclude=$OPTARG ;;
    k) keep=1 ;;
    *) sed -n '2,14p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
only=("$@")

# Inside the checkout (build*/ is git-ignored) so that ccache, with CCACHE_BASEDIR above it,
# sees the same relative paths as in a normal build and reuses its objects.
# MUTATION_DIR=DIR reuses a copy kept by an earlier -k run: only files changed since are copied
# again, so its build stays warm.
if [ -n "${MUTATION_DIR:-}" ]; then
  scratch=$(cd "$MUTATION_DIR" && pwd)
  keep=1
else
  scratch=$(mktemp -d "$repo/build-mutation.XXXXXX")
fi
[ "$keep" = 1 ] || trap 'rm -rf "$scratch"' EXIT
src="$scratch/src" build="$scratch/build" logs="$scratch/logs"
mkdir -p "$src" "$logs"
(cd "$repo" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp -u --parents -t "$src")
[ -d "$repo/tests/e2e/node_modules" ] && [ ! -e "$src/tests/e2e/node_modules" ] &&
  ln -s "$repo/tests/e2e/node_modules" "$src/tests/e2e/node_modules"

export CCACHE_BASEDIR=${CCACHE_BASEDIR:-/work} CCACHE_DIR=${CCACHE_DIR:-/work/.ccache}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPTOSS_CUDA=OFF "${launcher[@]}" >"$logs/configure.log"
ctest_args=(--test-dir "$build" -j2 --timeout 900)
if [ -n "$regex" ]; then ctest_args+=(-R "$regex"); else ctest_args+=(-L cpu); fi
[ -n "$exclude" ] && ctest_args+=(-E "$exclude")

echo "baseline: building and testing the unmutated copy"
cmake --build "$build" -j2 >"$logs/baseline-build.log" 2>&1 || { echo "baseline build failed: $logs/baseline-build.log"; exit 1; }
ctest "${ctest_args[@]}" >"$logs/baseline-test.log" 2>&1 || { echo "baseline tests fail: $logs/baseline-test.log"; exit 1; }

declare -a report
status=0
while IFS= read -r line; do
  [[ -z "${line// }" || "$line" == \#* ]] && continue
  name=$(echo "${line%%|*}" | xargs)
  rest=${line#*|}
  file=$(echo "${rest%%|*}" | xargs)
  subst=${rest#*|}
  subst=${subst# }
  if [ ${#only[@]} -gt 0 ] && [[ ! " ${only[*]} " == *" $name "* ]]; then continue; fi
  cp "$src/$file" "$scratch/pristine"
  perl -0pi -e "$subst" "$src/$file"
  if cmp -s "$src/$file" "$scratch/pristine"; then
    report+=("STALE     $name (the edit no longer applies to $file)")
    status=1
    continue
  fi
  echo "mutation $name: building and testing"
  if ! cmake --build "$build" -j2 >"$logs/$name-build.log" 2>&1; then
    report+=("KILLED    $name (does not build)")
  elif ctest "${ctest_args[@]}" >"$logs/$name-test.log" 2>&1; then
    report+=("SURVIVED  $name")
    status=1
  else
    failed=$(sed -n '/tests FAILED:/,$ s/^[[:space:]]*[0-9]* - \([^ ]*\) .*/\1/p' "$logs/$name-test.log" | head -5 | paste -sd, -)
    report+=("KILLED    $name (by: $failed)")
  fi
  cp "$scratch/pristine" "$src/$file"
  touch "$src/$file"
done <"$list"

echo
printf '%s\n' "${report[@]}"
[ "$keep" = 1 ] && echo "scratch copy, build and logs: $scratch"
exit $status
