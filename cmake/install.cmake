# `cmake --install`: the libraries (static) as the CMake package `troupe`,
# the headers the public one (troupe/troupe.h) needs, and the `troupe`
# command. A program then does
#
#   find_package(troupe REQUIRED)
#   target_link_libraries(app PRIVATE troupe::api)
#
# (examples/out_of_tree does; tests: examples.out_of_tree). Headers go to
# include/troupe/{gpu,comm,model,actors}/ and the public one to
# include/troupe/troupe.h; a target's include directories are include/ and
# include/troupe/, so troupe's own "actors/rank/rank.h" style includes resolve.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(troupe_libraries troupe_gpu troupe_comm troupe_model troupe_actors troupe_api)
foreach(lib IN LISTS troupe_libraries)
  string(REPLACE "troupe_" "" name ${lib})
  set_target_properties(${lib} PROPERTIES EXPORT_NAME ${name})
  target_include_directories(${lib} PUBLIC
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/troupe>)
endforeach()

install(TARGETS ${troupe_libraries} EXPORT troupeTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS troupe RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
foreach(dir gpu comm model actors)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/troupe
    FILES_MATCHING PATTERN "*.h")
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/api/troupe/troupe.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/troupe)

set(troupe_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/troupe)
install(EXPORT troupeTargets NAMESPACE troupe:: DESTINATION ${troupe_cmake_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/troupeConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/troupeConfig.cmake INSTALL_DESTINATION ${troupe_cmake_dir})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/troupeConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/troupeConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/troupeConfigVersion.cmake ${PROJECT_SOURCE_DIR}/cmake/FindCAF.cmake
  DESTINATION ${troupe_cmake_dir})
