"""Integration tests: a real tritonserver with the real Python backend, or a real vLLM engine (the `server` mark)."""
