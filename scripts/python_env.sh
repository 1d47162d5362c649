#!/usr/bin/env bash
# Makes the Python environment the Hugging Face comparison tests and the fixture generators use
# (torch, transformers, safetensors, tokenizers from PyPI; tensorboard for the event-file reader
# test; pyarrow for the Parquet fixtures of tests/data; peft for tests/golden/generate_lora.py)
# and prints its python. Kept in .venv/ of the repo; reused when it already imports everything.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv
if ! "$venv/bin/python" -c "import torch, transformers, safetensors, tokenizers, tensorboard, pyarrow, peft" >/dev/null 2>&1; then
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check torch transformers safetensors tokenizers numpy tensorboard pyarrow peft >&2
fi
echo "$PWD/$venv/bin/python"
