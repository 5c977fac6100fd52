#!/usr/bin/env bash
# Builds the CPU variant of the gptoss image from ./Dockerfile and checks it from outside the
# container: /health, /v1/models and one chat completion over HTTP, the image's HEALTHCHECK
# command, the non-root user, and that starting the server wrote nothing into the image.
#
# No Docker engine or registry is needed (nor reachable on the project's machines): it installs
# buildah and debootstrap from Debian, makes a Debian bookworm base image with debootstrap from
# the apt mirror this machine is configured with, imports it with `buildah from scratch`, builds
# with `buildah bud --isolation chroot` (vfs storage) and runs with `buildah run --isolation
# chroot` (the host's network: the server listens on a free port of this machine).
#
# Slow (compiles gptoss inside the image): not part of the README's default test run.
# Run as root. Usage: tools/docker/check.sh [--keep] [--layers] [--no-build]
#   --keep: leave the image in the store (as localhost/gptoss:cpu) for inspection;
#   --layers: keep every build step's layer, so a re-run after a source change starts at the
#     compile step (vfs copies the whole file system per step: ~20 GB instead of ~3 GB);
#   --no-build: check the image a --keep run left, without building it again.
# Environment: GPTOSS_DOCKER_WORK (work folder and image store, default /var/tmp/gptoss-docker),
#   JOBS (compile jobs, default 2), MIRROR (Debian mirror, default: from /etc/apt/sources.list*).
set -euo pipefail
cd "$(dirname "$0")/../.."

KEEP=0
LAYERS=false
BUILD=1
for a in "$@"; do
  case $a in
    --keep) KEEP=1 ;;
    --layers) LAYERS=true ;;
    --no-build) BUILD=0 KEEP=1 ;;
    *) echo "usage: $0 [--keep] [--layers] [--no-build]" >&2; exit 2 ;;
  esac
done
WORK=${GPTOSS_DOCKER_WORK:-/var/tmp/gptoss-docker}
JOBS=${JOBS:-2}
BASE_IMAGE=localhost/gptoss-debian:bookworm
IMAGE=localhost/gptoss:cpu
# A store of our own, so this never meets another user's containers/storage.conf or driver.
B=(buildah --root "$WORK/storage" --runroot "$WORK/run" --storage-driver vfs)

T0=$SECONDS
say() { printf '[check %3dm%02ds] %s\n' $(((SECONDS - T0) / 60)) $(((SECONDS - T0) % 60)) "$*"; }
fail() { say "FAIL: $*"; exit 1; }
[[ $(id -u) == 0 ]] || fail "run as root (debootstrap and buildah's chroot isolation need it)"
mkdir -p "$WORK"

# --- 1. tools --------------------------------------------------------------------------------
need=()
for p in buildah debootstrap curl jq docker-compose ca-certificates; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if ((${#need[@]})); then
  say "installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
say "$(buildah --version)"

# compose.yaml renders (every profile; docker-compose v1 checks it against the compose schema).
for profile in plain spec cpu tp; do
  docker-compose -f compose.yaml --profile "$profile" config -q ||
    fail "compose.yaml does not render with profile $profile"
done
say "compose.yaml renders (profiles plain, spec, cpu, tp)"

# --- 2. a Debian bookworm base image, made here --------------------------------------------
# The first Debian archive (not the security one) that apt is configured with, in either the
# one-line or the deb822 format.
mirror() {
  local m
  m=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
        awk '$1 == "deb" && $0 ~ / bookworm / && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }')
  if [[ -z $m ]]; then
    m=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
          awk '/^URIs:/ { u = $2 } /^Suites:/ && / bookworm( |$)/ && u !~ /security/ { print u; exit }')
  fi
  echo "${m:-http://deb.debian.org/debian}"
}
if "${B[@]}" inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; then
  say "base image $BASE_IMAGE already in $WORK/storage"
else
  MIRROR=${MIRROR:-$(mirror)}
  rootfs="$WORK/rootfs"
  rm -rf "$rootfs"
  say "debootstrap --variant=minbase bookworm from $MIRROR"
  debootstrap --variant=minbase bookworm "$rootfs" "$MIRROR" > "$WORK/debootstrap.log" 2>&1 ||
    { tail -20 "$WORK/debootstrap.log"; fail "debootstrap failed (log: $WORK/debootstrap.log)"; }
  # What the official debian images also leave out: downloaded packages and package lists.
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" --numeric-owner -cf "$WORK/rootfs.tar" .
  ctr=$("${B[@]}" from scratch)
  # A local tar archive is unpacked as it is, owners and modes kept.
  "${B[@]}" add "$ctr" "$WORK/rootfs.tar" / >/dev/null
  "${B[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd /bin/bash --os linux --arch "$(dpkg --print-architecture)" "$ctr"
  "${B[@]}" commit --rm -q "$ctr" "$BASE_IMAGE" >/dev/null
  rm -rf "$rootfs" "$WORK/rootfs.tar"
  say "base image $BASE_IMAGE committed"
fi

# --- 3. the CPU image from ./Dockerfile ------------------------------------------------------
if ((BUILD)); then
  say "buildah bud VARIANT=cpu (-j$JOBS; log: $WORK/build.log)"
  # The host's CA bundle goes to npm (egress here passes a TLS-inspecting proxy; elsewhere it is
  # just the usual CAs); it is mounted for the build only.
  if ! "${B[@]}" bud --isolation chroot --format docker --pull=never --layers="$LAYERS" \
        --volume /etc/ssl/certs/ca-certificates.crt:/run/build-ca.pem:ro \
        --build-arg BUILD_CA_FILE=/run/build-ca.pem \
        --build-arg VARIANT=cpu --build-arg CPU_BUILD_IMAGE="$BASE_IMAGE" \
        --build-arg CPU_RUNTIME_IMAGE="$BASE_IMAGE" --build-arg BUILD_JOBS="$JOBS" \
        -f Dockerfile -t "$IMAGE" . > "$WORK/build.log" 2>&1; then
    tail -30 "$WORK/build.log"
    fail "image build failed (log: $WORK/build.log)"
  fi
fi
say "image $IMAGE: $("${B[@]}" images --format '{{.Size}}' "$IMAGE")"

# The image's configuration: what `docker run` would do with it.
cfg=$("${B[@]}" inspect --type image "$IMAGE" | jq '.Docker.config')
entrypoint=$(jq -c '.Entrypoint' <<<"$cfg")
user=$(jq -r '.User' <<<"$cfg")
health=$(jq -c '.Healthcheck.Test' <<<"$cfg")
say "entrypoint $entrypoint, user $user, exposed $(jq -c '.ExposedPorts | keys' <<<"$cfg")"
say "healthcheck $health"
[[ $entrypoint == '["gptoss","serve","--host","0.0.0.0"]' ]] || fail "unexpected entrypoint $entrypoint"
[[ $user != "" && $user != 0* && $user != root* ]] || fail "the image runs as root ($user)"
[[ $(jq -r '.[0]' <<<"$health") == CMD ]] || fail "no HEALTHCHECK in the image"

# --- 4. run it and talk to it from outside ---------------------------------------------------
ctr=$("${B[@]}" from --pull=never "$IMAGE")
server_pid=""
cleanup() {
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM -- "-$server_pid" 2>/dev/null || true
    sleep 1
    kill -KILL -- "-$server_pid" 2>/dev/null || true
  fi
  "${B[@]}" umount "$ctr" >/dev/null 2>&1 || true
  "${B[@]}" rm "$ctr" >/dev/null 2>&1 || true
  # Stage containers buildah bud leaves behind (this store is ours alone).
  "${B[@]}" rm --all >/dev/null 2>&1 || true
  # The base image stays (120 MB, saves the debootstrap next time); --layers keeps its layers.
  if ((KEEP == 0)); then
    "${B[@]}" rmi "$IMAGE" >/dev/null 2>&1 || true
    [[ $LAYERS == true ]] || "${B[@]}" rmi --prune >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT
mnt=$("${B[@]}" mount "$ctr")
[[ -f $mnt/opt/gptoss/cache/gptoss/o200k_base.tiktoken ]] || fail "the tokenizer data is not in the image"
[[ -f $mnt/opt/gptoss/cache/gptoss/models/tiny-v1/config.json ]] || fail "the built-in model is not in the image"

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
touch "$WORK/before-start"
sleep 1  # so every write after this is strictly newer than the marker
# The image's entrypoint as `docker run IMAGE --port N` would start it, as the image's user,
# in its own process group so that it can be stopped as a whole.
mapfile -t argv < <(jq -r '.[]' <<<"$entrypoint")
say "starting: ${argv[*]} --port $port"
setsid "${B[@]}" run --isolation chroot --env GPTOSS_PORT="$port" "$ctr" -- \
  "${argv[@]}" --port "$port" > "$WORK/serve.log" 2>&1 &
server_pid=$!

for _ in $(seq 1 300); do
  curl -fsS -o /dev/null "http://127.0.0.1:$port/health" 2>/dev/null && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$WORK/serve.log"; fail "the server exited"; }
  sleep 0.5
done
health_body=$(curl -fsS "http://127.0.0.1:$port/health") || { cat "$WORK/serve.log"; fail "/health did not answer"; }
say "GET /health -> $health_body"

# The server process: the descendant of `buildah run` that runs gptoss.
descendants() {
  local p
  for p in $(ps -o pid= --ppid "$1"); do echo "$p"; descendants "$p"; done
}
gptoss_pid=""
for p in $(descendants "$server_pid"); do
  [[ $(ps -o comm= -p "$p") == gptoss ]] && gptoss_pid=$p
done
[[ -n $gptoss_pid ]] || fail "no gptoss process under buildah run"
gptoss_uid=$(ps -o uid= -p "$gptoss_pid" | tr -d ' ')
say "gptoss runs as uid $gptoss_uid (pid $gptoss_pid)"
[[ $gptoss_uid != 0 ]] || fail "gptoss runs as root"

models=$(curl -fsS "http://127.0.0.1:$port/v1/models")
jq -e '.data[0].id == "gpt-oss-tiny"' <<<"$models" >/dev/null || fail "/v1/models: $models"
say "GET /v1/models -> $(jq -c '[.data[].id]' <<<"$models")"

reply=$(curl -fsS "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model": "gpt-oss-tiny", "messages": [{"role": "user", "content": "Hello from outside the container"}],
       "max_tokens": 8, "temperature": 0}') || fail "chat completion failed"
jq -e '.object == "chat.completion" and (.choices | length) == 1
       and .choices[0].message.role == "assistant" and .usage.completion_tokens > 0
       and .usage.prompt_tokens > 0' <<<"$reply" >/dev/null || fail "unexpected chat completion: $reply"
say "POST /v1/chat/completions -> finish_reason $(jq -r '.choices[0].finish_reason' <<<"$reply"), usage $(jq -c .usage <<<"$reply")"

# The HEALTHCHECK command itself, run inside the container as Docker would.
mapfile -t hc < <(jq -r '.[1:][]' <<<"$health")
"${B[@]}" run --isolation chroot --env GPTOSS_PORT="$port" "$ctr" -- "${hc[@]}" ||
  fail "the image's HEALTHCHECK command failed against a healthy server"
say "HEALTHCHECK command: healthy"

# `docker stop` sends SIGTERM to the entrypoint's process; buildah would kill it outright if
# signalled itself, so the signal goes to gptoss.
kill -TERM "$gptoss_pid"
wait "$server_pid" || fail "the server exited with status $? after SIGTERM"
server_pid=""
grep -q "SIGTERM" "$WORK/serve.log" || { cat "$WORK/serve.log"; fail "the server did not see SIGTERM"; }
say "stopped by SIGTERM, exit status 0"

# Starting and serving wrote nothing into the image (only volumes may be written to). The
# run-time mount points buildah itself creates are left out.
written=$(cd "$mnt" && find . -xdev -newer "$WORK/before-start" \
            -not -path './proc*' -not -path './sys*' -not -path './dev*' -not -path './run*' \
            -not -path './tmp*' -not -path './etc/hosts' -not -path './etc/hostname' \
            -not -path './etc/resolv.conf' -not -path '.' -print)
[[ -z $written ]] || fail "the server wrote into the image: $written"
say "nothing written into the image's file system"

say "PASS ($(((SECONDS - T0) / 60))m$(((SECONDS - T0) % 60))s)"
