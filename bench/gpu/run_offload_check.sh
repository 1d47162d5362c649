#!/usr/bin/env bash
# One device call for the optimizer offload (docs/offload.md): CudaAdamW at offload 0 / 0.5 /
# 1 against the CPU step, the GPU arms through the check, the CUDA engine at offload 0 / 0.5 /
# 1, the step's time at those fractions (bench/offload), then `loom check optimizer --device
# cuda` without and with --offload at SIZE (default large; small takes seconds). Usage:
# [SIZE=small] [PARAMS=N] bench/gpu/run_offload_check.sh [DEVBIN],
# DEVBIN the folder bench/gpu/pack.sh fills (default .devbin). Exit status: the number of
# steps that failed (0: all passed).
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=$(cd "${1:-.devbin}" && pwd)
source bench/gpu/device_env.sh
export LD_LIBRARY_PATH="$bin/lib:$LD_LIBRARY_PATH"
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
failed=0
step() {  # step NAME COMMAND...: runs it from tests/ (where the gtest binaries expect to run)
  local name=$1; shift
  (cd tests && "$@") > "$out/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc"; tail -15 "$out/$name.log"
  [ $rc = 0 ] || failed=$((failed + 1))
}
step test_cuda_adamw "$bin/test_cuda_adamw"
step test_optimizer_check_cuda "$bin/test_optimizer_check_cuda"
step test_offload_engine "$bin/test_offload_engine"
# The step's time at offload 0 / 0.5 / 1, overlapped and in turn, over PARAMS parameters.
step bench_offload "$bin/bench_offload" "${PARAMS:-1000000000}"
for flags in "" "--offload"; do
  name=check-cuda${flags:+-offload}
  step "$name" "$bin/loom" check optimizer --device cuda $flags --size "${SIZE:-large}" --json
  python3 - "$out/$name.log" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
try:
    r = json.loads(text[text.index("{"):])
except ValueError:
    sys.exit("  no JSON report (see the log above)")
u = r["under_test"]
print(f'{r["device"]}: {r["result"]} in {r["seconds"]:.0f} s; under test {u["name"]}: step-1 {u["step1_error"]}, '
      f'step-3 {u["step3_error"]} (bound {u["step3_bound"]}), master mismatches {u["master_mismatches"]}')
PY
done
# At most 8 files come back from a device call: everything in one archive.
pack_logs "$out"
echo "failed steps: $failed"
exit $failed
