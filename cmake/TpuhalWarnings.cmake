# Warnings for every target the project builds. Shipped code builds for the
# baseline x86-64 ISA: code that wants wider vectors dispatches at run time.
add_library(tpuhal_warnings INTERFACE)
target_compile_options(tpuhal_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align
  -Wunused -Woverloaded-virtual -Wimplicit-fallthrough
  -Wformat=2)
# A unity build includes each .cpp into a batch file, so GCC takes the
# classes a .cpp defines for a header's and warns that their members'
# types are in an anonymous namespace; they are not shared with any other
# translation unit.
if(CMAKE_UNITY_BUILD AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  target_compile_options(tpuhal_warnings INTERFACE -Wno-subobject-linkage)
endif()
if(TPUHAL_WERROR)
  target_compile_options(tpuhal_warnings INTERFACE -Werror)
endif()

# tpuhal_layer(NAME src...): a static, position-independent layer library.
function(tpuhal_layer name)
  add_library(${name} STATIC ${ARGN})
  target_link_libraries(${name} PRIVATE tpuhal_warnings)
endfunction()
