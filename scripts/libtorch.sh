# Sourced by the build scripts: the LibTorch to build on, from STOWAGE_LIBTORCH.
#   debian (default)  Debian's libtorch-dev 1.13.1, CPU only; builds into build/
#   wheel             PyPI's torch 2.11.0 wheel, a CUDA 13.0 build, in the virtual
#                     environment of scripts/python_env.sh; builds into build-wheel/
# Sets libtorch_build (the default build folder) and torch_args (CMake arguments).
# Any other LibTorch: leave STOWAGE_LIBTORCH unset and pass -DTorch_DIR=... to build.sh.
libtorch=${STOWAGE_LIBTORCH:-debian}
torch_args=()
case "$libtorch" in
  debian)
    libtorch_build=$root/build
    ;;
  wheel)
    libtorch_build=$root/build-wheel
    python_env=$(bash "$root/scripts/python_env.sh")
    torch_prefix=$("$python_env/bin/python" -c "import torch.utils; print(torch.utils.cmake_prefix_path)")
    torch_cuda=$("$python_env/bin/python" -c "import torch; print(torch.version.cuda or '')" 2>/dev/null)
    torch_args=(-DCMAKE_PREFIX_PATH="$torch_prefix" -DSTOWAGE_PYTHON="$python_env/bin/python")
    if [ -n "$torch_cuda" ]; then
      # The wheel's CUDA code was built with nvcc $torch_cuda; LibTorch's CMake config
      # needs a toolkit for its headers and nvcc. One of the same release keeps a single
      # CUDA runtime in the process (same soname as the wheel's own libcudart).
      nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
      if [ ! -x "$nvcc" ]; then
        echo "libtorch: the torch wheel is a CUDA $torch_cuda build, and no CUDA toolkit (nvcc) was found" >&2
        exit 1
      fi
      toolkit_cuda=$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
      if [ "$toolkit_cuda" != "$torch_cuda" ]; then
        echo "libtorch: warning: the torch wheel was built with CUDA $torch_cuda, the toolkit at $nvcc is $toolkit_cuda" >&2
      fi
      torch_args+=(-DCMAKE_CUDA_COMPILER="$nvcc")
    fi
    ;;
  *)
    echo "libtorch: STOWAGE_LIBTORCH must be 'debian' or 'wheel', got '$libtorch'" >&2
    exit 2
    ;;
esac
