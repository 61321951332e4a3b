# Finds the LibTorch stowage builds on and says what it is: Debian's 1.13 by default, any
# other (PyPI's wheel through torch.utils.cmake_prefix_path, a pytorch.org zip) through
# Torch_DIR or CMAKE_PREFIX_PATH. Stops the configure step with a message naming what it
# found when that is no LibTorch, one older than 1.13, or one without c10d's Gloo backend.
# For a LibTorch built with CUDA it defines STOWAGE_WITH_CUDA for every user of the
# library and links the CUDA runtime, so that host buffers are pinned and device memory is
# reported. Sets STOWAGE_TORCH_VERSION, STOWAGE_WITH_CUDA and STOWAGE_CUDA_VERSION.

set(STOWAGE_MIN_TORCH_VERSION 1.13)

find_package(Torch CONFIG QUIET)
if(NOT Torch_FOUND)
  if(Torch_DIR AND NOT Torch_DIR MATCHES "-NOTFOUND$")
    message(FATAL_ERROR "stowage: Torch_DIR='${Torch_DIR}' holds no LibTorch: no usable TorchConfig.cmake "
                        "there. Point Torch_DIR at <libtorch>/share/cmake/Torch, or for a pip wheel use "
                        "-DCMAKE_PREFIX_PATH=$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')")
  endif()
  message(FATAL_ERROR "stowage: no LibTorch found. Install Debian's libtorch-dev (scripts/setup.sh), or set "
                      "Torch_DIR / CMAKE_PREFIX_PATH to another LibTorch (README, 'Building against your LibTorch')")
endif()

# TorchConfigVersion.cmake reports the version; a LibTorch too old to have one is too old.
if(NOT Torch_VERSION OR Torch_VERSION VERSION_LESS STOWAGE_MIN_TORCH_VERSION)
  message(FATAL_ERROR "stowage: the LibTorch at '${Torch_DIR}' is version '${Torch_VERSION}'; "
                      "stowage needs ${STOWAGE_MIN_TORCH_VERSION} or newer")
endif()

# c10d with its Gloo backend: the checkpoint collectives run on it. Its header includes
# gloo's, which pip wheels and pytorch.org zips do not ship (Debian's libgloo-dev does).
find_file(STOWAGE_C10D_GLOO_HEADER torch/csrc/distributed/c10d/ProcessGroupGloo.hpp
          PATHS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)
if(NOT STOWAGE_C10D_GLOO_HEADER)
  message(FATAL_ERROR "stowage: the LibTorch ${Torch_VERSION} at '${Torch_DIR}' has no c10d Gloo backend "
                      "(no torch/csrc/distributed/c10d/ProcessGroupGloo.hpp under ${TORCH_INCLUDE_DIRS}); "
                      "stowage needs a LibTorch built with USE_DISTRIBUTED and USE_GLOO")
endif()
find_path(STOWAGE_GLOO_INCLUDE_DIR gloo/algorithm.h HINTS ${STOWAGE_DEPS_DIR}/include ${TORCH_INCLUDE_DIRS})
if(NOT STOWAGE_GLOO_INCLUDE_DIR)
  message(FATAL_ERROR "stowage: c10d's Gloo header needs gloo's headers, and none were found (gloo/algorithm.h); "
                      "install Debian's libgloo-dev or set STOWAGE_GLOO_INCLUDE_DIR")
endif()

# TorchConfig finds some of its libraries (c10 among them) with find_library(... PATHS
# <its prefix>/lib), which searches the system's directories first: with a second
# LibTorch installed there (Debian's), a build on a pip wheel would link that one's libc10
# too, and abort at start-up. Where the found LibTorch has a library of that name itself,
# link that one.
set(stowage_torch_libraries)
foreach(library ${TORCH_LIBRARIES})
  get_filename_component(library_name "${library}" NAME)
  set(own "${TORCH_INSTALL_PREFIX}/lib/${library_name}")
  if(IS_ABSOLUTE "${library}" AND library_name MATCHES "^lib(c10|torch)" AND EXISTS "${own}"
     AND NOT library STREQUAL own)
    message(STATUS "stowage: linking ${own}, not ${library} (another LibTorch's)")
    set(library "${own}")
  endif()
  list(APPEND stowage_torch_libraries "${library}")
endforeach()
set(TORCH_LIBRARIES ${stowage_torch_libraries})

set(STOWAGE_TORCH_VERSION ${Torch_VERSION})
# A CUDA LibTorch defines the torch_cuda target; its config has already found the CUDA
# toolkit (CUDAToolkit_VERSION) that its CUDA libraries and nvcc belong to.
if(TARGET torch_cuda)
  set(STOWAGE_WITH_CUDA ON)
  set(STOWAGE_CUDA_VERSION "${CUDAToolkit_VERSION_MAJOR}.${CUDAToolkit_VERSION_MINOR}")
  # c10d's NCCL header includes nccl.h: the one beside a wheel's LibTorch (the NCCL it
  # loads) first, else the toolkit's.
  find_path(STOWAGE_NCCL_INCLUDE_DIR nccl.h HINTS ${TORCH_INSTALL_PREFIX}/../nvidia/nccl/include
            ${CUDAToolkit_INCLUDE_DIRS})
  if(NOT STOWAGE_NCCL_INCLUDE_DIR)
    message(FATAL_ERROR "stowage: the LibTorch ${Torch_VERSION} at '${Torch_DIR}' is a CUDA build, and no nccl.h "
                        "was found for c10d's NCCL backend (set STOWAGE_NCCL_INCLUDE_DIR)")
  endif()
else()
  set(STOWAGE_WITH_CUDA OFF)
  set(STOWAGE_CUDA_VERSION "")
endif()
message(STATUS "stowage: LibTorch ${Torch_VERSION} at ${Torch_DIR}; CUDA: "
               "${STOWAGE_WITH_CUDA} ${STOWAGE_CUDA_VERSION}")
