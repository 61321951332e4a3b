# Registers a GoogleTest executable's tests with ctest one suite a process: each suite is
# one ctest entry, named "<Suite>.*", that runs the suite's tests with --gtest_filter, so
# that the ~0.5 s LibTorch takes to start is paid once a suite, not once a test. Tests
# that need a process of their own (death tests, signals, environment variables, resource
# limits, the process's thread count, a process-wide switch) are named by ISOLATE, regular
# expressions over "<Suite>.<Test>": each such test is an entry of its own, named
# "<Suite>.<Test>" as gtest_discover_tests names it, and its suite's entry leaves it out.
# ctest's --output-on-failure shows gtest's output, which names each failed test and why.
#
#   stowage_add_test_suites(<target> [ISOLATE <regex>...] [TIMEOUT <s a suite>]
#                           [TEST_TIMEOUT <s a test>] [ENVIRONMENT <VAR=value>...])
#
# As gtest_discover_tests' PRE_TEST mode, the tests are listed when ctest runs (the
# executable's --gtest_list_tests), again whenever the executable is newer than the list.
# Each entry is labelled with the target's name (ctest -L).

set(STOWAGE_TEST_SUITES_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/StowageTestSuitesDiscover.cmake)

function(stowage_add_test_suites target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "TIMEOUT;TEST_TIMEOUT" "ISOLATE;ENVIRONMENT")
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT 900)
  endif()
  if(NOT arg_TEST_TIMEOUT)
    set(arg_TEST_TIMEOUT 600)
  endif()
  set(ctest_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_suites.cmake")
  set(include_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_suites_include.cmake")
  # Written at generation time, for $<TARGET_FILE>; read by ctest (TEST_INCLUDE_FILES).
  file(GENERATE OUTPUT "${include_file}" CONTENT
"set(executable [==[$<TARGET_FILE:${target}>]==])
if(EXISTS \"\${executable}\")
  if(NOT EXISTS [==[${ctest_file}]==] OR
     NOT [==[${ctest_file}]==] IS_NEWER_THAN \"\${executable}\" OR
     NOT [==[${ctest_file}]==] IS_NEWER_THAN \"\${CMAKE_CURRENT_LIST_FILE}\" OR
     NOT [==[${ctest_file}]==] IS_NEWER_THAN [==[${STOWAGE_TEST_SUITES_SCRIPT}]==])
    set(STOWAGE_SUITES_EXECUTABLE \"\${executable}\")
    set(STOWAGE_SUITES_LABEL [==[${target}]==])
    set(STOWAGE_SUITES_CTEST_FILE [==[${ctest_file}]==])
    set(STOWAGE_SUITES_WORKING_DIR [==[${CMAKE_CURRENT_BINARY_DIR}]==])
    set(STOWAGE_SUITES_ISOLATE [==[${arg_ISOLATE}]==])
    set(STOWAGE_SUITES_TIMEOUT [==[${arg_TIMEOUT}]==])
    set(STOWAGE_SUITES_TEST_TIMEOUT [==[${arg_TEST_TIMEOUT}]==])
    set(STOWAGE_SUITES_ENVIRONMENT [==[${arg_ENVIRONMENT}]==])
    include([==[${STOWAGE_TEST_SUITES_SCRIPT}]==])
  endif()
  include([==[${ctest_file}]==])
else()
  add_test([==[${target}_NOT_BUILT]==] [==[${target}_NOT_BUILT]==])
endif()
")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${include_file}")
endfunction()
