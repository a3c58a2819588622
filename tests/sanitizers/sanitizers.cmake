# The run-time environment of every test in a TROUPE_SANITIZE build
# (included by tests/CMakeLists.txt; docs/CI.md explains each setting).
# Sets TROUPE_SANITIZER_ENV, a list of VAR=value, empty without sanitizers.
set(TROUPE_SANITIZER_ENV "")
if(NOT TROUPE_SANITIZE)
  return()
endif()
set(_supp ${CMAKE_CURRENT_LIST_DIR})

# UCX's memory hooks patch malloc/mmap, which the sanitizers intercept
# themselves; with the hooks on, UCX and the sanitizer runtime fight over
# the same symbols (crashes at start-up under TSan, false reports).
list(APPEND TROUPE_SANITIZER_ENV
  UCX_MEM_EVENTS=no UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_MALLOC_HOOKS=no)

if(TROUPE_SANITIZE MATCHES "address")
  # detect_stack_use_after_return: callbacks that outlive the frame whose
  # locals they captured, the actor/stream code's likeliest memory error.
  list(APPEND TROUPE_SANITIZER_ENV
    "ASAN_OPTIONS=detect_leaks=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1"
    "LSAN_OPTIONS=suppressions=${_supp}/lsan.supp")
endif()
if(TROUPE_SANITIZE MATCHES "undefined")
  # Recoverable checks (so that suppressions apply), fatal by halt_on_error.
  list(APPEND TROUPE_SANITIZER_ENV
    "UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=${_supp}/ubsan.supp")
endif()
if(TROUPE_SANITIZE MATCHES "thread")
  # OMP_THREAD_LIMIT=1: one OpenMP thread per stream. Debian's libgomp is
  # not instrumented and synchronises its team with raw futexes, which
  # TSan cannot see: with more than one thread per team every kernel's
  # writes would be reported as races. Not covered under TSan, therefore:
  # the parallel regions inside kernels and oneDNN (they run on one thread
  # each; the ASan build and the ordinary build run them multi-threaded).
  list(APPEND TROUPE_SANITIZER_ENV OMP_THREAD_LIMIT=1
    "TSAN_OPTIONS=second_deadlock_stack=1")
endif()
