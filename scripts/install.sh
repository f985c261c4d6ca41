#!/usr/bin/env bash
# Create .venv with triton-sam, its export extra (torch, sam2) and the test tools, and
# .venv-server with the local Triton server (nvidia-pytriton pins numpy<2; the plugin uses numpy 2).
# Usage: bash scripts/install.sh            (from the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
"$PYTHON" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip wheel setuptools
# torch first: sam2's build needs it, and sam2 must be built without build isolation.
python -m pip install -q torch==2.14.1 torchvision==0.29.1
SAM2_BUILD_CUDA=0 python -m pip install -q --no-build-isolation sam2==1.1.0
python -m pip install -q -e ".[export,test,bench]"
triton-sam server-env --path .venv-server
echo "Installed into .venv: activate it with '. .venv/bin/activate'; 'triton-sam serve' from .venv uses .venv-server, from any directory"
