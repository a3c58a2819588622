#!/bin/sh
# must_fail.sh COMMAND [ARG...]: runs COMMAND with its output passed through,
# for the tests of bad input. Such a test matches the error message with
# PASS_REGULAR_EXPRESSION, which ignores the exit code, and fails on this
# script's own line (FAIL_REGULAR_EXPRESSION "must_fail: ", troupe_must_fail
# in tests/CMakeLists.txt) when COMMAND exits 0 or dies by a signal: bad
# input is a clear error and a non-zero exit, not a success or a crash.
"$@"
rc=$?
if [ "$rc" -eq 0 ]; then
  echo "must_fail: $1 exited 0 where an error was wanted"
  exit 1
elif [ "$rc" -gt 125 ]; then
  echo "must_fail: $1 ended with $rc (killed by a signal, or not run) where an error exit was wanted"
  exit 1
fi
