#!/bin/sh
# `cmake --install`, then examples/out_of_tree built against the installed
# package with find_package(troupe) and run; the installed package must
# not point into the source or build tree.
#
#   install_test.sh CMAKE GENERATOR CXX BUILD_DIR SOURCE_DIR WORK
set -eu
cmake=$1 generator=$2 cxx=$3 build=$4 source=$5 work=$6
rm -rf "$work"
"$cmake" --install "$build" --config Release --prefix "$work/prefix" > "$work.install.log" 2>&1 || {
  cat "$work.install.log"; echo "FAIL: cmake --install"; exit 1; }
if grep -rl -e "$source" -e "$build" "$work/prefix/lib/cmake"; then
  echo "FAIL: the installed package points into the source or build tree"; exit 1
fi
"$cmake" -S "$source/examples/out_of_tree" -B "$work/build" -G "$generator" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix"
"$cmake" --build "$work/build" --config Release
exe=$(find "$work/build" -name stop_on_loss -type f -perm -u+x | head -n 1)
"$exe" 6.0
echo "OK: stop_on_loss built against the installed troupe (find_package) and ran"
