-- wrk script: small completion requests against an OpenAI-compatible server.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model": "qwen-mock", "prompt": "The quick brown fox jumps over the lazy dog", "max_tokens": 8}'
