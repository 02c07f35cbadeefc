# Install: headers, libtpuhal, the CLI (tools/), board profiles (simulator/),
# a CMake package (find_package(tpuhal) -> tpuhal::tpuhal) and a pkg-config
# file (tpuhal.pc).
include(CMakePackageConfigHelpers)

# Each file belongs to an install component, one per Debian package that
# scripts/package.sh makes (docs/packages.md): runtime (libtpuhal0), dev,
# tools, simd, python, gst, device-plugin.
install(TARGETS tpuhal tpuhal_headers EXPORT tpuhalTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/hal/include/tpuhal DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev)

set(_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/tpuhal)
install(EXPORT tpuhalTargets NAMESPACE tpuhal:: DESTINATION ${_cmake_dir} COMPONENT dev)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/tpuhalConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/tpuhalConfig.cmake INSTALL_DESTINATION ${_cmake_dir})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/tpuhalConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/tpuhalConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/tpuhalConfigVersion.cmake DESTINATION ${_cmake_dir} COMPONENT dev)

# The .pc file finds its prefix relative to itself, so an installed tree can
# move (cmake --install --prefix anywhere).
file(RELATIVE_PATH TPUHAL_PC_TO_PREFIX "/root/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/root")
configure_file(${CMAKE_CURRENT_LIST_DIR}/tpuhal.pc.in ${CMAKE_CURRENT_BINARY_DIR}/tpuhal.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/tpuhal.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)
