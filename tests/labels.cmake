# ctest labels and per-test environment (docs/CI.md has the table).
#
# Every test carries exactly one speed label, `fast` or `slow`, and may add:
#   timing  timing-sensitive (deadlines, sleeps, killed processes): RUN_SERIAL,
#           never run under sanitizers, whose slowdown breaks the deadlines
#   e2e     end to end: whole runs of several troupe processes (launch.*,
#           ckpt.*'s resumes and reshards, trace.e2e_*) or of other
#           programs (trace.render's Chromium), driven from Python. The
#           ordinary build runs them; the sanitizer builds do not, as the
#           library code they run is the unit and runtime tests' (which
#           the sanitizers do run) at three times the cost (docs/CI.md)
#   cli     runs the `troupe` executable (its commands, their output and
#           exit codes): troupe_cli_test() below, which tests/CMakeLists.txt
#           uses for every test whose command names the executable. The
#           ordinary build runs them; a sanitizer build does not make the
#           executable unless asked (`ninja troupe`) and scripts/test leaves
#           them out there: the executable is a thin layer of flag parsing
#           and printing over the libraries, whose own tests the sanitizers
#           run (docs/CI.md)
#   root    needs root; scripts/test skips it otherwise
#   gpu     needs GPUs (a CUDA build with NCCL registers it); skips, exit 77,
#           where there are too few
#   bench   a measurement, not a check; run by scripts/bench only
#   tsan    what `scripts/test --sanitize thread` runs: the suites that do
#           not run actors. Debian's CAF 0.17 library is not instrumented,
#           and its scheduler, mailboxes and reference counts synchronise
#           inside it, so TSan reports every hand-off between actors
#           (docs/CI.md)
# `tests.labels` (a test itself) fails naming any test without exactly one
# speed label.
#
#   troupe_discover_tests(gpu_test SLOW "Ops.Big*:Ops.Huge*" TIMING "Stream.Deadline*")
#
# registers the GoogleTest cases of a target: those matching the SLOW filter
# (gtest syntax, ':'-separated patterns) are `slow`, those matching TIMING
# are `fast;timing` (`slow;timing` with TIMING_SLOW), the rest `fast`; with
# TSAN all also `tsan`. Every case gets TROUPE_TEST_ENV plus ENVIRONMENT, and
# TIMEOUT 300 unless PROPERTIES says otherwise.
#
# Why not gtest_discover_tests(... PROPERTIES LABELS ...): CMake 3.25 splits
# list values there (LABELS "fast;timing" becomes a property named
# `timing`). Lists are set instead by a ctest-side script included right
# after each discovery's own, over the discovered names (TEST_LIST).

# The environment of every test: OMP_WAIT_POLICY=passive (ctest runs two
# processes on two cores, and OpenMP threads that spin at barriers while
# their team-mate is descheduled made a 0.5 s training run take 12 s), and
# the sanitizers' run-time settings in a TROUPE_SANITIZE build.
include(${CMAKE_CURRENT_LIST_DIR}/sanitizers/sanitizers.cmake)
# (A failing run's flight recorder goes under build/flight-records, not into
# each test's working directory. TROUPE_DEVICE=cpu pins --device where a
# test does not give it: the default would be a GPU where one is.)
set(TROUPE_TEST_ENV OMP_WAIT_POLICY=passive TROUPE_FLIGHT_DIR=${CMAKE_BINARY_DIR}/flight-records
  TROUPE_DEVICE=cpu ${TROUPE_SANITIZER_ENV})

function(_troupe_discover target filter labels env)
  get_property(count GLOBAL PROPERTY _troupe_discover_count)
  if(NOT count)  # (not `n`: if() reads N as the constant false)
    set(count 0)
  endif()
  math(EXPR count "${count} + 1")
  set_property(GLOBAL PROPERTY _troupe_discover_count ${count})
  set(list_var troupe_discovered_${count})
  gtest_discover_tests(${target} TEST_FILTER "${filter}" TEST_LIST ${list_var}
    DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 300 ${ARGN})
  # Runs in ctest after the discovery's include file (appended after it).
  set(script ${CMAKE_CURRENT_BINARY_DIR}/${target}_labels_${count}.cmake)
  # (No warning while the executable is not built: then there is no list.)
  string(CONCAT content
    "if(EXISTS \"$<TARGET_FILE:${target}>\" AND NOT ${list_var})\n"
    "  message(WARNING \"troupe: no ${target} case matches '${filter}' (tests/CMakeLists.txt)\")\n"
    "endif()\n"
    "foreach(t IN LISTS ${list_var})\n"
    "  set_tests_properties(\"\${t}\" PROPERTIES LABELS \"${labels}\" ENVIRONMENT \"${env}\")\n"
    "endforeach()\n")
  file(GENERATE OUTPUT ${script} CONTENT "${content}")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${script})
endfunction()

function(troupe_discover_tests target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "TIMING_SLOW;TSAN" "SLOW;TIMING" "ENVIRONMENT;PROPERTIES")
  set(env ${TROUPE_TEST_ENV} ${arg_ENVIRONMENT})
  set(tsan "")
  if(arg_TSAN)
    set(tsan ";tsan")
  endif()
  set(others "")
  foreach(f IN ITEMS ${arg_SLOW} ${arg_TIMING})
    string(APPEND others ":${f}")
  endforeach()
  string(REGEX REPLACE "^:" "-" others "${others}")
  _troupe_discover(${target} "*${others}" "fast${tsan}" "${env}" ${arg_PROPERTIES})
  if(arg_SLOW)
    set(not_timing "")
    if(arg_TIMING)
      set(not_timing "-${arg_TIMING}")
    endif()
    _troupe_discover(${target} "${arg_SLOW}${not_timing}" "slow${tsan}" "${env}" ${arg_PROPERTIES})
  endif()
  if(arg_TIMING)
    set(speed fast)
    if(arg_TIMING_SLOW)
      set(speed slow)
    endif()
    _troupe_discover(${target} "${arg_TIMING}" "${speed};timing${tsan}" "${env}" ${arg_PROPERTIES}
      RUN_SERIAL TRUE)
  endif()
endfunction()

# Labels and environment of the tests added with add_test() in this
# directory, at its end (deferred): TROUPE_TEST_ENV for all; `cli` for
# those troupe_cli_test() added and those that need a fixture one of them
# sets up; `slow` for
# those named in TROUPE_SLOW_TESTS, `fast` for the others that have no speed
# label yet; those in TROUPE_TIMING_TESTS also `timing` and RUN_SERIAL.
function(troupe_label_added_tests)
  set(arg_SLOW ${TROUPE_SLOW_TESTS})
  set(arg_TIMING ${TROUPE_TIMING_TESTS})
  get_property(tests DIRECTORY PROPERTY TESTS)
  foreach(t IN LISTS arg_SLOW arg_TIMING)
    if(NOT t IN_LIST tests)
      message(FATAL_ERROR "troupe_label_added_tests: no test named ${t}")
    endif()
  endforeach()
  get_property(cli DIRECTORY PROPERTY TROUPE_CLI_TESTS)
  # A test that needs a fixture a `cli` test sets up is `cli` too: ctest
  # would run that setup for it, and the setup needs the executable.
  set(changed TRUE)
  while(changed)
    set(changed FALSE)
    set(cli_fixtures "")
    foreach(t IN LISTS cli)
      get_test_property(${t} FIXTURES_SETUP made)
      if(made)
        list(APPEND cli_fixtures ${made})
      endif()
    endforeach()
    foreach(t IN LISTS tests)
      if(t IN_LIST cli)
        continue()
      endif()
      get_test_property(${t} FIXTURES_REQUIRED needs)
      foreach(x IN LISTS needs)
        if(x IN_LIST cli_fixtures)
          list(APPEND cli ${t})
          set(changed TRUE)
          break()
        endif()
      endforeach()
    endforeach()
  endwhile()
  foreach(t IN LISTS tests)
    set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT ${TROUPE_TEST_ENV})
    if(t IN_LIST cli)
      set_property(TEST ${t} APPEND PROPERTY LABELS cli)
    endif()
    get_test_property(${t} LABELS labels)
    if(NOT labels MATCHES "(^|;)(fast|slow)(;|$)")
      if(t IN_LIST arg_SLOW)
        set_property(TEST ${t} APPEND PROPERTY LABELS slow)
      else()
        set_property(TEST ${t} APPEND PROPERTY LABELS fast)
      endif()
    endif()
    if(t IN_LIST arg_TIMING)
      set_property(TEST ${t} APPEND PROPERTY LABELS timing)
      set_property(TEST ${t} PROPERTY RUN_SERIAL TRUE)
    endif()
  endforeach()
endfunction()
cmake_language(DEFER CALL troupe_label_added_tests)

# add_test() for a test whose command names the troupe executable
# ($<TARGET_FILE:troupe>, TROUPE_BIN): the same arguments, and label `cli`.
function(troupe_cli_test)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "NAME" "")
  if(NOT arg_NAME)
    message(FATAL_ERROR "troupe_cli_test: give NAME (add_test's signature)")
  endif()
  # add_test's arguments one by one, their semicolons escaped (a shell
  # command's `;` would split an argument in two).
  set(args "")
  math(EXPR last "${ARGC} - 1")
  foreach(i RANGE ${last})
    string(REPLACE ";" "\\;" a "${ARGV${i}}")
    list(APPEND args "${a}")
  endforeach()
  add_test(${args})
  # (Labelled at the directory's end, troupe_label_added_tests: a later
  # set_tests_properties(... LABELS ...) replaces the list.)
  set_property(DIRECTORY APPEND PROPERTY TROUPE_CLI_TESTS ${arg_NAME})
endfunction()
