// The cluster files of launcher/plan/clusters/, built into the binary
// (clusters.cc is generated from them by CMake).
#pragma once

#include <vector>

namespace troupe::launcher::plan {

struct BuiltinCluster {
  const char* name;
  const char* json;
};

const std::vector<BuiltinCluster>& builtin_clusters();

}  // namespace troupe::launcher::plan
