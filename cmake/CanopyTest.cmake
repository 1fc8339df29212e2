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
  gtest_discover_tests(${T_NAME}
    DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS "${T_NAME};${T_LABELS}" TIMEOUT ${T_TIMEOUT})
endfunction()
