# Sourced on the device machine: where its CUDA libraries are (KINDS.md), and the shared
# libraries carried from the build machine (.devbin/lib: yaml-cpp and the like).
py_nvidia=/opt/torch/.venv/lib/python3.12/site-packages/nvidia
export LD_LIBRARY_PATH="$PWD/.devbin/lib:$py_nvidia/cudnn/lib:$py_nvidia/cu13/lib:$py_nvidia/nccl/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
