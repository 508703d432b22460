# `cmake --install`: the headers, libmoekit.a, libmoekit_c.so, the Python package (with the C
# library beside it) and a CMake package:
#
#   find_package(moekit 0.1 REQUIRED)
#   target_link_libraries(app PRIVATE moekit::moekit)    # the C++ library, linked whole-archive
#   target_link_libraries(tool PRIVATE moekit::moekit_c) # the C API (include/moekit/moekit_c.h)
include(CMakePackageConfigHelpers)
set(MOEKIT_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/moekit)
set(MOEKIT_PYTHON_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/python3/dist-packages
    CACHE STRING "Where `cmake --install` puts the Python package moekit (relative to the prefix)")

# The installed C library finds its external dependencies (cuBLASLt) where the build found them.
set_target_properties(moekit_c PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)

install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/moekit DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# NOTE: `moekit` (the whole-archive link) is made again by moekitConfig.cmake: an exported
# $<LINK_LIBRARY:WHOLE_ARCHIVE,...> keeps the in-tree target name.
install(TARGETS moekit_static moekit_c EXPORT moekitTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT moekitTargets NAMESPACE moekit:: DESTINATION ${MOEKIT_INSTALL_CMAKEDIR})
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/moekitConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/moekitConfig.cmake
                              INSTALL_DESTINATION ${MOEKIT_INSTALL_CMAKEDIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/moekitConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/moekitConfig.cmake ${CMAKE_BINARY_DIR}/moekitConfigVersion.cmake
        DESTINATION ${MOEKIT_INSTALL_CMAKEDIR})

install(DIRECTORY ${CMAKE_SOURCE_DIR}/python/moekit DESTINATION ${MOEKIT_PYTHON_INSTALL_DIR}
        PATTERN __pycache__ EXCLUDE)
install(TARGETS moekit_c LIBRARY DESTINATION ${MOEKIT_PYTHON_INSTALL_DIR}/moekit)
