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
