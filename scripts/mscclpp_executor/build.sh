#!/usr/bin/env bash
# Build MSCCL++'s core library and run_plan (the plan driver) into BUILD (default /tmp/mscclpp-build).
#
#   scripts/mscclpp_executor/build.sh MSCCLPP_SOURCE [BUILD]
#
# Only the executor is built: no Python bindings, NCCL shim, InfiniBand or GDRCopy. Offline (a lent
# GPU machine reaches nothing), set JSON_HPP to a copy of nlohmann/json's single json.hpp and
# NUMA_ROOT to a folder with include/numa.h and lib/libnuma.so (from the libnuma-dev package).
set -euxo pipefail
source=$(cd "$1" && pwd)
build=${2:-/tmp/mscclpp-build}
here=$(cd "$(dirname "$0")" && pwd)
export PATH=/usr/local/cuda/bin:$PATH
options=()
if [ -n "${JSON_HPP:-}" ]; then  # a stand-in for nlohmann/json's CMake project: the header-only target MSCCL++ links
  mkdir -p "$build/json/single_include/nlohmann"
  cp "$JSON_HPP" "$build/json/single_include/nlohmann/json.hpp"
  printf '%s\n' 'cmake_minimum_required(VERSION 3.25)' 'project(nlohmann_json LANGUAGES CXX)' \
    'add_library(nlohmann_json INTERFACE)' 'add_library(nlohmann_json::nlohmann_json ALIAS nlohmann_json)' \
    'target_include_directories(nlohmann_json INTERFACE ${CMAKE_CURRENT_SOURCE_DIR}/single_include)' \
    > "$build/json/CMakeLists.txt"
  options+=(-DFETCHCONTENT_SOURCE_DIR_JSON="$build/json" -DFETCHCONTENT_FULLY_DISCONNECTED=ON)
fi
if [ -n "${NUMA_ROOT:-}" ]; then
  options+=(-DNUMA_INCLUDE_DIR="$NUMA_ROOT/include" -DNUMA_LIB_DIR="$NUMA_ROOT/lib")
fi
cmake -S "$source" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMSCCLPP_BYPASS_GPU_CHECK=ON -DMSCCLPP_USE_CUDA=ON -DMSCCLPP_GPU_ARCHS="${GPU_ARCHS:-90}" \
  -DMSCCLPP_USE_IB=OFF -DMSCCLPP_USE_GDRCOPY=OFF -DMSCCLPP_BUILD_PYTHON_BINDINGS=OFF \
  -DMSCCLPP_BUILD_EXT_NCCL=OFF -DMSCCLPP_BUILD_EXT_COLLECTIVES=OFF -DMSCCLPP_BUILD_TESTS=OFF "${options[@]}"
ninja -C "$build" mscclpp
rpath=("-Xlinker" "-rpath=$build/lib")
if [ -n "${NUMA_ROOT:-}" ]; then rpath+=("-Xlinker" "-rpath=$NUMA_ROOT/lib"); fi
nvcc -x cu -std=c++20 -O2 -arch="sm_${GPU_ARCHS:-90}" "$here/run_plan.cc" -I"$source/include" -I"$build/include" \
  -L"$build/lib" -lmscclpp "${rpath[@]}" -o "$build/run_plan"
