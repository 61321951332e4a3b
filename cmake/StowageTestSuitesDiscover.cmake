# Run by ctest (through the include file of stowage_add_test_suites, cmake/StowageTestSuites.cmake)
# to list a GoogleTest executable's tests and write their ctest entries: one a suite, and one
# for each test that an ISOLATE expression names. Reads the STOWAGE_SUITES_* variables that
# the include file sets.

execute_process(
  COMMAND "${STOWAGE_SUITES_EXECUTABLE}" --gtest_list_tests
  WORKING_DIRECTORY "${STOWAGE_SUITES_WORKING_DIR}"
  TIMEOUT 120  # loads LibTorch: slow on a machine whose page cache is cold
  OUTPUT_VARIABLE listing
  ERROR_VARIABLE listing_errors
  RESULT_VARIABLE listed)
if(NOT listed EQUAL 0)
  message(FATAL_ERROR "stowage: ${STOWAGE_SUITES_EXECUTABLE} --gtest_list_tests failed (${listed}):\n"
                      "${listing}${listing_errors}")
endif()

# The listing: "Suite." lines (a parameterized one: "Prefix/Suite.  # TypeParam = ..."), each
# followed by its "  Test" lines ("  Test/0  # GetParam() = ..."). Names are C++
# identifiers, with '/' and digits for parameters: nothing that needs quoting below.
string(REPLACE ";" "," listing "${listing}")  # a parameter's printed value may hold one
string(REPLACE "\n" ";" lines "${listing}")
set(suite_count 0)
foreach(line IN LISTS lines)
  if(line MATCHES "^([A-Za-z0-9_/]+)\\.( .*)?$")
    math(EXPR suite_count "${suite_count} + 1")
    set(suite_${suite_count} "${CMAKE_MATCH_1}")
    set(tests_${suite_count})
  elseif(line MATCHES "^  ([A-Za-z0-9_/]+)( .*)?$")
    if(suite_count EQUAL 0)
      message(FATAL_ERROR "stowage: ${STOWAGE_SUITES_EXECUTABLE} listed test '${line}' before any suite")
    endif()
    list(APPEND tests_${suite_count} "${CMAKE_MATCH_1}")
  elseif(line MATCHES "^ ")
    message(FATAL_ERROR "stowage: ${STOWAGE_SUITES_EXECUTABLE} listed a test this script can't name: '${line}'")
  endif()  # else gtest_main's "Running main() from ..." or an empty line
endforeach()

# A suite entry counts as skipped only when gtest skipped every one of its tests and
# failed none: its summary then ends "[  PASSED  ] 0 tests." and the list of the skipped,
# with no "[  FAILED  ]" list after it. (ctest's skip expression wins over the exit status.)
set(all_skipped "\\[  PASSED  \\] 0 tests\\.\n\\[  SKIPPED \\] [0-9]+ tests?, listed below:\n(\\[  SKIPPED \\] [^\n]+\n)+\n*$")
set(common_properties WORKING_DIRECTORY "[==[${STOWAGE_SUITES_WORKING_DIR}]==]" LABELS "[==[${STOWAGE_SUITES_LABEL}]==]")
if(STOWAGE_SUITES_ENVIRONMENT)
  list(APPEND common_properties ENVIRONMENT "[==[${STOWAGE_SUITES_ENVIRONMENT}]==]")
endif()
list(JOIN common_properties " " common_properties)

set(script "")
set(entries 0)
foreach(index RANGE 1 ${suite_count})
  if(suite_count EQUAL 0)
    break()
  endif()
  set(suite "${suite_${index}}")
  set(isolated)
  set(grouped 0)
  foreach(test IN LISTS tests_${index})
    set(alone FALSE)
    foreach(pattern IN LISTS STOWAGE_SUITES_ISOLATE)
      if("${suite}.${test}" MATCHES "${pattern}")
        set(alone TRUE)
      endif()
    endforeach()
    if(alone)
      list(APPEND isolated "${suite}.${test}")
    else()
      math(EXPR grouped "${grouped} + 1")
    endif()
  endforeach()
  foreach(name IN LISTS isolated)
    string(APPEND script
      "add_test([==[${name}]==] [==[${STOWAGE_SUITES_EXECUTABLE}]==] [==[--gtest_filter=${name}]==])\n"
      "set_tests_properties([==[${name}]==] PROPERTIES ${common_properties} TIMEOUT ${STOWAGE_SUITES_TEST_TIMEOUT} "
      "SKIP_REGULAR_EXPRESSION [==[\\[  SKIPPED \\]]==])\n")
    math(EXPR entries "${entries} + 1")
  endforeach()
  if(grouped GREATER 0)
    set(filter "${suite}.*")
    if(isolated)
      list(JOIN isolated ":" left_out)
      string(APPEND filter ":-${left_out}")
    endif()
    string(APPEND script
      "add_test([==[${suite}.*]==] [==[${STOWAGE_SUITES_EXECUTABLE}]==] [==[--gtest_filter=${filter}]==])\n"
      "set_tests_properties([==[${suite}.*]==] PROPERTIES ${common_properties} TIMEOUT ${STOWAGE_SUITES_TIMEOUT} "
      "SKIP_REGULAR_EXPRESSION [==[${all_skipped}]==])\n")
    math(EXPR entries "${entries} + 1")
  endif()
endforeach()
if(entries EQUAL 0)
  message(FATAL_ERROR "stowage: ${STOWAGE_SUITES_EXECUTABLE} lists no tests")
endif()
file(WRITE "${STOWAGE_SUITES_CTEST_FILE}" "${script}")
