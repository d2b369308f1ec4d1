# tspemu::openblas: OpenBLAS itself (not the libblas alternative) as one imported target. The
# reference pins it to one thread per rank with openblas_set_num_threads(1), which only OpenBLAS
# provides.
#
# Requires: find_package(OpenBLAS CONFIG) first. OpenBLAS's CMake config defines variables only
# (OpenBLAS_INCLUDE_DIRS, OpenBLAS_LIBRARIES), not a target; this file is included both by the
# build and by the installed tspemuConfig.cmake, so the exported $<LINK_ONLY:tspemu::openblas> of
# the static tspemu::reference resolves to the consumer's own OpenBLAS, not to paths recorded on
# the build machine.
if(NOT TARGET tspemu::openblas)
  add_library(tspemu::openblas INTERFACE IMPORTED)
  set_target_properties(tspemu::openblas PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${OpenBLAS_INCLUDE_DIRS}"
    INTERFACE_LINK_LIBRARIES "${OpenBLAS_LIBRARIES}")
endif()
