# Sourced by scripts/test.sh, scripts/tsan.sh and scripts/package.sh.
#
#   configure_with CC CXX BUILD [CMAKE_ARGS...]
#
# Configures BUILD with Ninja and the compilers CC and CXX (names on PATH,
# or paths). A tree configured before with other compilers is configured
# afresh: CMake keeps the compilers of its cache and would ignore CC/CXX.
configure_with() {
  local cc cxx build=$3
  cc=$(command -v "$1") || { echo "tpuhal: no $1 (scripts/setup.sh installs clang and gcc)" >&2; return 1; }
  cxx=$(command -v "$2") || { echo "tpuhal: no $2 (scripts/setup.sh installs clang and g++)" >&2; return 1; }
  if [[ -f $build/CMakeCache.txt ]] && ! { grep -qxF "CMAKE_CXX_COMPILER:FILEPATH=$cxx" "$build/CMakeCache.txt" &&
    grep -qxF "CMAKE_C_COMPILER:FILEPATH=$cc" "$build/CMakeCache.txt"; }; then
    rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
  fi
  # clang links with lld: the sanitizer trees link a hundred large test
  # programs, and lld links the largest in a third of GNU ld's time. Set
  # either way, so that a tree configured before with lld does not keep it
  # where there is none. TPUHAL_CUDA_FATBIN, when set, is the CUDA kernels'
  # fatbin another tree of these sources built (drivers/CMakeLists.txt); set
  # either way too.
  local ld=
  if [[ $($cxx --version) == *clang* ]] && command -v ld.lld >/dev/null; then ld=-fuse-ld=lld; fi
  CC=$cc CXX=$cxx cmake -S "$root" -B "$build" -G Ninja "-DCMAKE_EXE_LINKER_FLAGS=$ld" \
    "-DCMAKE_SHARED_LINKER_FLAGS=$ld" "-DCMAKE_MODULE_LINKER_FLAGS=$ld" \
    "-DTPUHAL_CUDA_FATBIN=${TPUHAL_CUDA_FATBIN:-}" "${@:4}" >/dev/null
}
