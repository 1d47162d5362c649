#!/usr/bin/env bash
# Coverage-guided fuzzing of loom's input parsers with libFuzzer (tests/fuzz/README.md): builds
# the targets of tests/fuzz with clang, ASan and UBSan (CPU only, only the concerns they
# link), replays every input of tests/fuzz/regressions/<target>/, then runs each target from
# its seed corpus (tests/fuzz/corpus/<target>/) for SECONDS_PER_TARGET seconds with a fixed
# libFuzzer seed. Exits 1 on any finding: a crash, a sanitizer report, an exception other
# than InputError, a timeout or running out of memory; the input that caused it is left in
# BUILD_DIR/fuzz-findings/<target>/ (keep it as a regression input once fixed).
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [extra cmake args...]
# SECONDS_PER_TARGET defaults to 30; BUILD_DIR is LOOM_FUZZ_BUILD_DIR or build-fuzz.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
shift || true
build_dir=${LOOM_FUZZ_BUILD_DIR:-build-fuzz}

# clang and its runtime libraries (libFuzzer, the sanitizers) from Debian, beside what the
# libraries themselves build with (scripts/setup.sh).
packages=(clang libclang-rt-14-dev cmake make pkg-config nlohmann-json3-dev libyaml-cpp-dev libcli11-dev
          libssl-dev)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "fuzz: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

targets=(safetensors_header config_json tokenizer_json recipe_yaml rows_jsonl conversations_jsonl row_store
         checkpoint_meta)
# Parquet input's target where Apache Arrow is there to build it (scripts/setup.sh fetches it).
if compgen -G ".deps/arrow/lib/libparquet.so.*" >/dev/null; then targets+=(parquet); fi
# -O1 with line tables: quick to build, and sanitizer reports name file and line. Debug keeps
# the assertions (nlohmann's among them) that a Release build would compile out.
CC=clang CXX=clang++ cmake -S . -B "$build_dir" -DLOOM_FUZZ=ON -DLOOM_WERROR=ON -DLOOM_ENABLE_CUDA=OFF \
  -DBUILD_TESTING=OFF "-DLOOM_CONCERNS=core;ops;model;parallel;io;data;recipe;train" -DCMAKE_BUILD_TYPE=Debug \
  "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -gline-tables-only" "$@" >/dev/null
build_targets=()
for t in "${targets[@]}"; do build_targets+=(--target "fuzz_$t"); done
cmake --build "$build_dir" -j"$(nproc)" "${build_targets[@]}"

failed=()
for t in "${targets[@]}"; do
  binary="$build_dir/tests/fuzz/fuzz_$t"
  findings="$build_dir/fuzz-findings/$t"
  work="$build_dir/fuzz-corpus/$t"  # what this run adds to the seeds; emptied so runs repeat
  log="$build_dir/fuzz-$t.log"
  rm -rf "$work" && mkdir -p "$work" "$findings"
  regressions=(tests/fuzz/regressions/"$t"/*)
  if [ -e "${regressions[0]}" ] && ! "$binary" "${regressions[@]}" >"$log" 2>&1; then
    echo "fuzz: $t: a regression input fails again (log: $log)"
    tail -n 30 "$log"
    failed+=("$t")
    continue
  fi
  if "$binary" -seed=1 -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$findings/" "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1; then
    echo "fuzz: $t: no finding in ${seconds}s ($(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" |
      grep -o '[0-9]*$') runs, $(grep -o 'cov: [0-9]*' "$log" | tail -n 1))"
  else
    echo "fuzz: $t: FINDING (input in $findings/, log: $log)"
    tail -n 40 "$log"
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: findings in ${failed[*]}"
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, no finding"
