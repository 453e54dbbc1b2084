"""Unit tests: no tritonserver and no vLLM engine (`pytest tests/unit`, or `pytest -m "not server"`)."""
