//! CPU-only inference engine with vLLM's surfaces; the engine core lands with the mock engine issue.
