# Install rules and the exported CMake package, so a trainer can use
#   find_package(pacer REQUIRED)
#   target_link_libraries(my_trainer PRIVATE pacer::worker_sdk)   # or pacer::c_api, pacer::ps
# Installs the SDK's static libraries, their headers (with the generated protobuf/gRPC headers
# they include), pacerConfig.cmake / pacerConfigVersion.cmake / pacerTargets.cmake, and the
# pacerd, pacerctl, pacer-agent and pacer-ps programs (also imported as pacer::pacerd, ...).
# Included last from the top-level CMakeLists.txt, once every target exists.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(PACER_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/pacer)

# Build-tree include directories must not leak into the installed targets: the same headers
# are found under <prefix>/include (sources: "worker_sdk/client.h", "common/status.h";
# generated: "proto/pacer/sharding.pb.h", which itself includes "pacer/...pb.h").
set_property(TARGET pacer_common PROPERTY INTERFACE_INCLUDE_DIRECTORIES
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
set_property(TARGET pacer_proto PROPERTY INTERFACE_INCLUDE_DIRECTORIES
  $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/proto>
  $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/proto>)

set(PACER_EXPORTED_LIBS pacer_common pacer_proto pacer_worker_sdk pacer_c_api pacer_ps)
foreach(t pacer_worker_sdk pacer_c_api pacer_ps pacerd pacerctl pacer-agent pacer-ps)
  if(NOT TARGET ${t})
    message(FATAL_ERROR "PacerInstall.cmake: target ${t} is gone; update the install rules")
  endif()
endforeach()
foreach(lib ${PACER_EXPORTED_LIBS})
  string(REGEX REPLACE "^pacer_" "" export_name ${lib})
  set_target_properties(${lib} PROPERTIES EXPORT_NAME ${export_name})
endforeach()
set(PACER_EXPORTED_PROGRAMS pacerd pacerctl pacer-agent pacer-ps)

install(TARGETS ${PACER_EXPORTED_LIBS} ${PACER_EXPORTED_PROGRAMS}
  EXPORT pacerTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

install(DIRECTORY ${PROJECT_SOURCE_DIR}/worker_sdk/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/worker_sdk
  FILES_MATCHING PATTERN "*.h" PATTERN "python" EXCLUDE)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/common/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/common
  FILES_MATCHING PATTERN "*.h")
install(DIRECTORY ${PROJECT_BINARY_DIR}/proto/pacer/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/proto/pacer
  FILES_MATCHING PATTERN "*.pb.h")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/proto/pacer/ DESTINATION ${CMAKE_INSTALL_DATADIR}/pacer/proto/pacer
  FILES_MATCHING PATTERN "*.proto")

# What operators need beside the daemons: pacer-policy (the policy files' headers tell users to
# run `pacer-policy validate`), the policy presets and their JSON schema.
install(TARGETS pacer-policy RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/policies/ DESTINATION ${CMAKE_INSTALL_DATADIR}/pacer/policies
  FILES_MATCHING PATTERN "*.yaml" PATTERN "*.json")

install(EXPORT pacerTargets NAMESPACE pacer:: DESTINATION ${PACER_INSTALL_CMAKEDIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/pacerConfig.cmake.in
  ${PROJECT_BINARY_DIR}/pacerConfig.cmake INSTALL_DESTINATION ${PACER_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/pacerConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/pacerConfig.cmake ${PROJECT_BINARY_DIR}/pacerConfigVersion.cmake
  DESTINATION ${PACER_INSTALL_CMAKEDIR})
