# The installable tspemu package: find_package(tspemu) with targets tspemu::<module>, and
# lib/pkgconfig/tspemu.pc.
#
# A module library joins the package with one line in its CMakeLists.txt, after add_library:
#   tspemu_package_library(tspemu_<module>)
# Call it in dependency order (a module after the modules it links), which add_subdirectory order
# already gives: tspemu.pc lists the archives in reverse registration order, as a static link needs.
# The top-level CMakeLists.txt calls tspemu_install_package() once, after every module.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(TSPEMU_PACKAGE_CMAKE_DIR ${CMAKE_CURRENT_LIST_DIR})

# tspemu_package_library(tspemu_<module>): exported as tspemu::<module>, its public include
# directory include/ in the source tree and in the install prefix, C++20 required of consumers
# (the headers use std::span and designated initializers), installed to lib/ in the export set.
function(tspemu_package_library target)
  if(NOT target MATCHES "^tspemu_([a-z_]+)$" OR NOT TARGET ${target})
    message(FATAL_ERROR "tspemu_package_library(${target}): expected an existing library target "
                        "named tspemu_<module>")
  endif()
  set(module ${CMAKE_MATCH_1})
  # A header-only module (core) is an INTERFACE library: its usage requirements only.
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "INTERFACE_LIBRARY")
    set(scope INTERFACE)
  else()
    set(scope PUBLIC)
  endif()
  target_include_directories(${target} ${scope} $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                                                $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_compile_features(${target} ${scope} cxx_std_20)
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${module})
  install(TARGETS ${target} EXPORT tspemuTargets)
  set_property(GLOBAL APPEND PROPERTY TSPEMU_PACKAGE_LIBRARIES ${target})
endfunction()

# Headers, export set, config + version files and tspemu.pc, for every registered library.
function(tspemu_install_package)
  get_property(libraries GLOBAL PROPERTY TSPEMU_PACKAGE_LIBRARIES)
  list(TRANSFORM libraries REPLACE "^tspemu_" "" OUTPUT_VARIABLE components)
  list(JOIN components " " TSPEMU_PACKAGE_COMPONENTS)
  set(config_dir ${CMAKE_INSTALL_LIBDIR}/cmake/tspemu)

  install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/tspemu DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
          FILES_MATCHING PATTERN "*.hpp" PATTERN "*.h")
  install(EXPORT tspemuTargets NAMESPACE tspemu:: DESTINATION ${config_dir})

  # The reference's link-only dependencies exist only when it is built (not TSPEMU_RUNTIME_ONLY).
  if(TARGET tspemu_reference)
    set(TSPEMU_PACKAGE_HAS_KERNELS TRUE)
    set(pc_requires "openblas tbb")
    set(pc_extra_libs "-ldnnl")  # oneDNN ships no pkg-config file
  else()
    set(TSPEMU_PACKAGE_HAS_KERNELS FALSE)
    set(pc_requires "")
    set(pc_extra_libs "")
  endif()
  # The runtime's MPI transport links OpenMPI's C library (no installed header includes mpi.h).
  if(TSPEMU_HAVE_MPI)
    string(STRIP "${pc_requires} ompi-c" pc_requires)
  endif()
  configure_package_config_file(${TSPEMU_PACKAGE_CMAKE_DIR}/tspemuConfig.cmake.in
                                ${PROJECT_BINARY_DIR}/tspemuConfig.cmake
                                INSTALL_DESTINATION ${config_dir})
  # 0.x: a minor version may break the API.
  write_basic_package_version_file(${PROJECT_BINARY_DIR}/tspemuConfigVersion.cmake
                                   COMPATIBILITY SameMinorVersion)
  install(FILES ${PROJECT_BINARY_DIR}/tspemuConfig.cmake
                ${PROJECT_BINARY_DIR}/tspemuConfigVersion.cmake
                ${TSPEMU_PACKAGE_CMAKE_DIR}/tspemuOpenBLAS.cmake
                ${TSPEMU_PACKAGE_CMAKE_DIR}/tspemuOneDNN.cmake
          DESTINATION ${config_dir})

  set(pc_libs "")
  foreach(target IN LISTS libraries)
    get_target_property(type ${target} TYPE)
    if(NOT type STREQUAL "INTERFACE_LIBRARY")  # header-only: no archive to link
      set(pc_libs "-l${target} ${pc_libs}")
    endif()
  endforeach()
  string(STRIP "${pc_libs}" pc_libs)
  # ${pcfiledir}-relative prefix: `cmake --install --prefix P` may choose any prefix after
  # configuration, so the configured CMAKE_INSTALL_PREFIX cannot be written into the file.
  file(RELATIVE_PATH pc_prefix /root/${CMAKE_INSTALL_LIBDIR}/pkgconfig /root)
  string(REGEX REPLACE "/$" "" pc_prefix ${pc_prefix})
  configure_file(${TSPEMU_PACKAGE_CMAKE_DIR}/tspemu.pc.in ${PROJECT_BINARY_DIR}/tspemu.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/tspemu.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endfunction()
