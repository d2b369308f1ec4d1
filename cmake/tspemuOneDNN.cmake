# tspemu::onednn: oneDNN (Debian's libdnnl-dev) as one imported target, for the reference's bf16
# GEMMs (reference/bf16_gemm.cpp). A library rather than hand-written kernels: a bf16 GEMM at
# twice sgemm's rate needs a JIT-blocked VDPBF16PS kernel per shape class, which oneDNN ships
# tested and tuned (and OpenBLAS as Debian builds it lacks: no sbgemm); a plain loop would be
# several times slower than the sgemm it is meant to beat.
#
# Found by its header and library, not oneDNN's own CMake config: that config requires OpenCL's
# development files (its GPU runtime), which the CPU GEMM does not use. Included both by the build
# and by the installed tspemuConfig.cmake, so the static tspemu::reference's link-only dependency
# resolves to the consumer's oneDNN.
if(NOT TARGET tspemu::onednn)
  find_path(TSPEMU_ONEDNN_INCLUDE_DIR oneapi/dnnl/dnnl.h)
  find_library(TSPEMU_ONEDNN_LIBRARY dnnl)
  if(NOT TSPEMU_ONEDNN_INCLUDE_DIR OR NOT TSPEMU_ONEDNN_LIBRARY)
    message(FATAL_ERROR "tspemu: oneDNN not found (oneapi/dnnl/dnnl.h: ${TSPEMU_ONEDNN_INCLUDE_DIR}, "
                        "libdnnl: ${TSPEMU_ONEDNN_LIBRARY}); on Debian: apt-get install libdnnl-dev")
  endif()
  add_library(tspemu::onednn INTERFACE IMPORTED)
  set_target_properties(tspemu::onednn PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${TSPEMU_ONEDNN_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${TSPEMU_ONEDNN_LIBRARY}")
endif()
