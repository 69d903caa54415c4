# CUDA backend detection. VLAC_CUDA: AUTO (default) builds src/backends/cuda wherever nvcc is
# found (GPU-less machines too: the code must always compile), ON requires it, OFF skips it.
# Sets VLAC_HAVE_CUDA for src/, tests/ and bench/.
set(VLAC_CUDA AUTO CACHE STRING "Build the CUDA backend: AUTO (where nvcc exists), ON or OFF")
set_property(CACHE VLAC_CUDA PROPERTY STRINGS AUTO ON OFF)
# sm_80 (A100-class), sm_87 (Jetson Orin), sm_90a (H100/H200: sm_90 with wgmma) machine code + sm_90 PTX
# for newer GPUs. Without a 90a entry the wgmma kernels are left out (VLAC_CUDA_SM90A).
set(VLAC_CUDA_ARCHITECTURES "80-real;87-real;90a-real;90-virtual" CACHE STRING "CUDA_ARCHITECTURES of the CUDA backend")
option(VLAC_CUDA_PTXAS_VERBOSE "Print ptxas register/shared-memory/spill reports (-Xptxas -v)" OFF)
set(VLAC_HAVE_CUDA OFF)
if(VLAC_FUZZ AND VLAC_CUDA STREQUAL "AUTO")
  # The fuzz build is clang + sanitizers and fuzzes host code only.
  message(STATUS "vlac: the CUDA backend is skipped in the fuzz build")
elseif(CMAKE_CROSSCOMPILING AND VLAC_CUDA STREQUAL "AUTO")
  # The host's nvcc has no CUDA runtime for the target (e.g. the aarch64 preset on x86-64).
  message(STATUS "vlac: the CUDA backend is skipped when cross-compiling (VLAC_CUDA=ON forces it)")
elseif(NOT VLAC_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    # CMake 3.25 knows no C++20 flag for nvcc (CUDA_STANDARD falls back to CXX_STANDARD = 20).
    if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION OR CMAKE_CUDA20_STANDARD_COMPILE_OPTION STREQUAL "")
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    # CMake 3.25's FindCUDAToolkit tags CUDA::nvToolsExt as deprecated without checking that the
    # target exists when the project requires CMake >= 3.25; CUDA 13 ships no nvToolsExt library,
    # so on Debian's unpatched cmake-data the call fails ("set_property could not find TARGET
    # CUDA::nvToolsExt"). Looking the toolkit up as a 3.24 project skips that one property.
    set(_vlac_cmake_min ${CMAKE_MINIMUM_REQUIRED_VERSION})
    set(CMAKE_MINIMUM_REQUIRED_VERSION 3.24)
    find_package(CUDAToolkit REQUIRED)
    set(CMAKE_MINIMUM_REQUIRED_VERSION ${_vlac_cmake_min})
    set(VLAC_HAVE_CUDA ON)
    message(STATUS "vlac: CUDA backend enabled (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, archs ${VLAC_CUDA_ARCHITECTURES})")
  elseif(VLAC_CUDA STREQUAL "ON")
    message(FATAL_ERROR "vlac: VLAC_CUDA=ON but no CUDA compiler (nvcc) was found")
  else()
    message(STATUS "vlac: no CUDA compiler (nvcc) found: the CUDA backend is skipped")
  endif()
endif()
