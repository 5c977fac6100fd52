#!/usr/bin/env bash
# Packs prebuilt binaries for the GPU machine into .gpu-carry-pack/bin.tar.xz (ignored by git), so
# a device call carries them instead of building there:
#   PACK_TESTS="test_cuda_kernels test_cuda_model" tools/gpu/pack.sh [BUILD_DIR]
# The archive holds gptoss, the named test binaries (from BUILD_DIR/tests/cuda), data/ (the test
# fixtures), o200k_base.tiktoken, and lib/: the shared libraries the binaries link from Debian
# packages that the GPU image (Ubuntu with CUDA, PyTorch and NCCL) may lack. CUDA's own libraries,
# the driver and glibc stay behind: the image has them. EXTRA_BINS names more files to add (say an
# older gptoss, to compare in the same round). The device call then runs
#   mkdir -p .gpu-carry && tar -C .gpu-carry -xJf .gpu-carry-pack/bin.tar.xz && bash tools/gpu/rounds/X.sh
# with carry [".gpu-carry-pack"]; tools/gpu/rounds/prelude.sh reads .gpu-carry/.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib" "$stage/data"
bins=("$build/gptoss")
for t in ${PACK_TESTS:-}; do bins+=("$build/tests/cuda/$t"); done
for b in ${EXTRA_BINS:-}; do bins+=("$b"); done
for b in "${bins[@]}"; do
  [ -x "$b" ] || { echo "pack: $b is not built" >&2; exit 1; }
  cp "$b" "$stage/"
  # Libraries from Debian packages, not glibc's, the C++ runtime's, CUDA's or the driver's.
  ldd "$b" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
    case $(basename "$lib") in
      libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;;
      libcuda.so*|libcudart*|libcublas*|libnccl*|libnvidia*|libnvrtc*|libcufile*) ;;
      *) cp -L "$lib" "$stage/lib/" ;;
    esac
  done
done
cp -r "$root/tests/data/." "$stage/data/"
tik=${GPTOSS_TIKTOKEN:-${XDG_CACHE_HOME:-$HOME/.cache}/gptoss/o200k_base.tiktoken}
[ -f "$tik" ] && cp "$tik" "$stage/o200k_base.tiktoken"
mkdir -p "$root/.gpu-carry-pack"
# xz -9's 64 MiB window spans the binaries, which share most of their bytes (the kernels' fatbins):
# gptoss, test_cuda_kernels and two diagnostic copies of gptoss pack into 26 MB, 43 MB at xz's default.
XZ_OPT=${XZ_OPT:--9} tar -C "$stage" -cJf "$root/.gpu-carry-pack/bin.tar.xz" .
du -sh "$root/.gpu-carry-pack/bin.tar.xz"
ls "$stage" "$stage/lib"
