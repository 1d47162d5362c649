# Sourced on the device machine: where its CUDA libraries are (the device image's torch
# environment ships cuDNN, cuBLAS and NCCL), and the shared
# libraries carried from the build machine (.devbin/lib: yaml-cpp and the like).
py_nvidia=/opt/torch/.venv/lib/python3.12/site-packages/nvidia
export LD_LIBRARY_PATH="$PWD/.devbin/lib:$py_nvidia/cudnn/lib:$py_nvidia/cu13/lib:$py_nvidia/nccl/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
# At most 8 files come back from a device call: every file under $1 into $1/logs.tgz. The
# archive is written outside the folder it reads (tar fails on a folder that changes under it).
pack_logs() {
  local tmp="/tmp/logs.$$.tgz"
  tar czf "$tmp" -C "$1" . && find "$1" -type f -delete && mv "$tmp" "$1/logs.tgz"
}
# power_summary LABEL TRACE.csv (bench/gpu/power_trace.sh's): the median board power and SM
# clock over the loaded samples (above 400 W), one line beginning with LABEL.
power_summary() {
  python3 - "$@" <<'PY'
import sys, statistics
label, path = sys.argv[1:]
rows = [l.split(", ") for l in open(path) if l.strip()]
busy = [(float(r[3].split()[0]), int(r[1].split()[0])) for r in rows
        if len(r) > 3 and r[3].split()[0].replace('.', '').isdigit() and float(r[3].split()[0]) > 400]
print(f"{label}: {len(rows)} samples, {len(busy)} above 400 W: board power median "
      f"{statistics.median(p for p, _ in busy) if busy else 0:.0f} W, SM clock median "
      f"{statistics.median(c for _, c in busy) if busy else 0} MHz there")
PY
}
# run_gtest BINARY SECONDS FILTER: .devbin/BINARY from tests/ with a gtest filter and a time
# limit, its log in $out/BINARY.log (the caller's $out), then one line of its exit code and
# passed / failed counts and the first lines of its failures.
run_gtest() {
  (cd tests && timeout "$2" "../.devbin/$1" --gtest_filter="$3" > "$out/$1.log" 2>&1)
  echo "$1 rc=$? ($SECONDS s): $(grep -cE '^\[ +OK' "$out/$1.log") passed, $(grep -cE '^\[  FAILED  \] [A-Z]' "$out/$1.log") failed"
  grep -E "^\[  FAILED|Failure|error:|vs fp32|correlation|FP8 LoRA|GPU bf16 vs" "$out/$1.log" | head -12
}
