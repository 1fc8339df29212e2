# Finds the optional transport backends via pkg-config.
# Sets CANOPY_HAVE_DPDK / CANOPY_HAVE_RDMA (ON/OFF) and imported targets
# PkgConfig::DPDK, PkgConfig::IBVERBS, PkgConfig::RDMACM.

function(canopy_resolve_backend name setting)
  # ${ARGN}: pkg-config module names, all required for the backend.
  set(found ON)
  foreach(module IN LISTS ARGN)
    string(TOUPPER "${module}" var)
    string(REGEX REPLACE "^LIB" "" var "${var}")
    if(NOT setting STREQUAL "OFF")
      pkg_check_modules(${var} QUIET IMPORTED_TARGET ${module})
    endif()
    if(NOT ${var}_FOUND)
      set(found OFF)
    endif()
  endforeach()
  if(setting STREQUAL "OFF")
    set(found OFF)
  elseif(setting STREQUAL "ON" AND NOT found)
    message(FATAL_ERROR "CANOPY_WITH_${name}=ON but pkg-config did not find: ${ARGN} (run scripts/install-deps.sh)")
  endif()
  set(CANOPY_HAVE_${name} ${found} PARENT_SCOPE)
endfunction()

canopy_resolve_backend(DPDK "${CANOPY_WITH_DPDK}" libdpdk)
canopy_resolve_backend(RDMA "${CANOPY_WITH_RDMA}" libibverbs librdmacm)
