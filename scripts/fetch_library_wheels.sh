#!/usr/bin/env bash
# The wheels of the library-backed paths' packages (attnbench/libraries), for a GPU machine with
# no network: fetched here into .whl/ (ignored by git, small enough to travel with the checkout),
# installed there offline before `attnbench gpu-check`:
#   python3 -m pip install -q --no-index --no-deps .whl/*.whl
# (or, where the environment is read-only, with --target /tmp/site and
#   export PYTHONPATH=/tmp/site:$PYTHONPATH).
# PYTHON_VERSION: the GPU machine's Python (default 3.12). --no-deps with each dependency named,
# so nothing pulls torch. All are pure Python but xformers (3 MB, compiled for torch >= 2.10 and
# CUDA: the GPU machine only, so constraints.txt does not pin it).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON_VERSION:-3.12}
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d .whl \
  "local-attention==1.11.2" "hyper-connections==0.4.11" "torch-einops-utils==0.2.0" \
  "einops==0.8.2" "fla-core==0.6.0" "sageattention==1.0.6" \
  "xformers==0.0.35"  # constraints.txt's pins
ls -la .whl
du -sh .whl
