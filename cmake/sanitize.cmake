# TROUPE_SANITIZE: build every C/C++ target with gcc's -fsanitize.
#   cmake -B build-asan -DTROUPE_SANITIZE=address,undefined
#   cmake -B build-tsan -DTROUPE_SANITIZE=thread
# scripts/test --sanitize LIST does this and runs ctest with the runtime
# options of tests/sanitizers/ (docs/CI.md). Third-party libraries (CAF,
# UCX, oneDNN, libgomp, Abseil) stay uninstrumented Debian builds.
if(NOT TROUPE_SANITIZE)
  return()
endif()

string(REPLACE "," ";" _troupe_sanitizers "${TROUPE_SANITIZE}")
foreach(s IN LISTS _troupe_sanitizers)
  if(NOT s MATCHES "^(address|undefined|thread)$")
    message(FATAL_ERROR "TROUPE_SANITIZE=${TROUPE_SANITIZE}: unknown sanitizer '${s}'; "
      "use address,undefined or thread")
  endif()
endforeach()
if("thread" IN_LIST _troupe_sanitizers AND "address" IN_LIST _troupe_sanitizers)
  message(FATAL_ERROR "TROUPE_SANITIZE=${TROUPE_SANITIZE}: gcc cannot combine thread with address")
endif()

# GCC's manual on -fsanitize: "sanitizers tend to increase the rate of
# false positive warnings, most notably those around -Wmaybe-uninitialized"
# (here: in CAF's config_value variant, actors/runtime/in_process.cc). The ordinary
# build keeps that warning as an error; the sanitizer builds drop it.
list(APPEND TROUPE_WARNINGS -Wno-maybe-uninitialized)

# -O1, as AddressSanitizer's documentation advises for reasonable speed:
# the sanitizer build is the longest step of CI, and -O3's compile time
# buys nothing there (its tests take about a minute either way).
foreach(flags CMAKE_C_FLAGS_RELEASE CMAKE_CXX_FLAGS_RELEASE)
  string(REGEX REPLACE "-O[23]" "-O1" ${flags} "${${flags}}")
endforeach()

# -g1: file:line in the reports at little compile cost. UBSan stays
# recoverable so that its suppressions work (they apply to recoverable
# checks only); UBSAN_OPTIONS=halt_on_error=1 makes every other report fatal.
add_compile_options(
  "$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=${TROUPE_SANITIZE};-fno-omit-frame-pointer;-g1>")
add_link_options("$<$<LINK_LANGUAGE:C,CXX>:-fsanitize=${TROUPE_SANITIZE}>")

# CPU only: ASan's shadow gap is where the CUDA driver maps memory (cudaInit
# fails under ASan unless protect_shadow_gap=0), and neither sanitizer sees
# inside the driver; device code is compute-sanitizer's job.
set(TROUPE_CUDA OFF)
message(STATUS "troupe: sanitizers ${TROUPE_SANITIZE} (CUDA backend off)")
