# Installation (cmake --install) and the Debian package (cpack -G DEB).
#
#   bin:      canopy, and the tools as canopy-rcopy, canopy-bench, canopy-httpd,
#             canopy-get, canopy-load, canopy-chaosproxy (prefixed: Debian's
#             rdmacm-utils already ships an rcopy, and get/load/bench are too
#             generic for /usr/bin)
#   share:    canopy/schemas/*.schema.json (the tools' --json output)
#   doc:      README.md, rcopy.md, httpd.md, examples/node.conf
#   systemd:  /usr/lib/systemd/system/canopy-node@.service (reads /etc/canopy/NAME.conf)
#             and canopy-rcopy-server.service
# The package's dependencies are the shared libraries the binaries link
# (dpkg-shlibdeps) plus adduser for the postinst that creates the canopy user.
include(GNUInstallDirs)

set(CANOPY_INSTALLED_TOOLS
  canopy_rcopy_tool=canopy-rcopy
  canopy_bench_tool=canopy-bench
  httpd=canopy-httpd
  get=canopy-get
  load=canopy-load
  chaosproxy=canopy-chaosproxy)

install(TARGETS canopy RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
foreach(pair IN LISTS CANOPY_INSTALLED_TOOLS)
  string(REPLACE "=" ";" parts "${pair}")
  list(GET parts 0 target)
  list(GET parts 1 installed_name)
  install(PROGRAMS $<TARGET_FILE:${target}> DESTINATION ${CMAKE_INSTALL_BINDIR} RENAME ${installed_name})
endforeach()

file(GLOB CANOPY_SCHEMAS ${PROJECT_SOURCE_DIR}/tools/*/*.schema.json)
install(FILES ${CANOPY_SCHEMAS} DESTINATION ${CMAKE_INSTALL_DATADIR}/canopy/schemas)

install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(FILES ${PROJECT_SOURCE_DIR}/tools/rcopy/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR} RENAME rcopy.md)
install(FILES ${PROJECT_SOURCE_DIR}/tools/httpd/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR} RENAME httpd.md)
install(FILES ${PROJECT_SOURCE_DIR}/packaging/node.conf.example DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples
        RENAME node.conf)

# PREFIX/lib/systemd/system: /usr/lib/systemd/system in the package (Debian 12 is usr-merged).
install(FILES ${PROJECT_SOURCE_DIR}/packaging/systemd/canopy-node@.service
              ${PROJECT_SOURCE_DIR}/packaging/systemd/canopy-rcopy-server.service
        DESTINATION lib/systemd/system)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME canopy)
set(CPACK_PACKAGE_VENDOR "canopy")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_PACKAGE_DESCRIPTION
    "Replicated tree store (leader/replica over TCP, DPDK or RDMA) with its tools: rcopy, bench, httpd, get, load.")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "canopy developers <canopy@localhost>")
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser")
set(CPACK_DEBIAN_COMPRESSION_TYPE gzip)  # fast to build in the packaging test
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${PROJECT_SOURCE_DIR}/packaging/debian/postinst ${PROJECT_SOURCE_DIR}/packaging/debian/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
