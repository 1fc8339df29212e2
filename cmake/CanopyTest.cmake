include(GoogleTest)
find_package(GTest REQUIRED)

# canopy_test(NAME <name> SOURCES <files...> LIBS <targets...> [LABELS <labels...>] [TIMEOUT <s>])
# One gtest binary per unit; each TEST becomes its own ctest test so that
# ctest -j spreads them over the cores. Labels let CI tell hardware-only and
# slow tests apart (e.g. "hardware", "slow", "cluster").
function(canopy_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} canopy_testing GTest::gtest GTest::gtest_main Threads::Threads)
  gtest_discover_tests(${T_NAME} DISCOVERY_TIMEOUT 60 TEST_LIST ${T_NAME}_TESTS)
  # gtest_discover_tests writes PROPERTIES into its script unquoted, which
  # breaks list values such as several labels; so labels and the timeout are
  # applied by a second include file that ctest reads after the discovered
  # test list.
  set(labels_file "${CMAKE_CURRENT_BINARY_DIR}/${T_NAME}_labels.cmake")
  file(WRITE "${labels_file}"
    "foreach(t IN LISTS ${T_NAME}_TESTS)\n"
    "  set_tests_properties(\"\${t}\" PROPERTIES LABELS \"${T_NAME};${T_LABELS}\" TIMEOUT ${T_TIMEOUT})\n"
    "endforeach()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${labels_file}")
endfunction()
