#!/usr/bin/env bash
# Sets up, builds with AddressSanitizer + UBSan, and runs every test (CTest). GPU tests
# skip with a message where there is no GPU; the Hugging Face comparison tests use the
# Python environment of scripts/python_env.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build-test -DLOOM_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
if python=$(scripts/python_env.sh); then
  export LOOM_PYTHON="$python"
else
  echo "test: could not make the Python environment; the transformers comparison tests will skip" >&2
fi
cd build-test
ctest --output-on-failure -j"$(nproc)" "$@"
