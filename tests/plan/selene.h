// Selene's cluster file for the planner's tests (plan_test.cc,
// plan_hardware_test.cc).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "launcher/plan/clusters.h"
#include "launcher/plan/hardware.h"

namespace troupe::launcher::plan {

inline Cluster selene() {
  absl::StatusOr<Cluster> c = load_cluster("dgx-a100-80gb-selene");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// Selene's file with some fields' values replaced (the first field of
// each name), parsed as `file`.
inline absl::StatusOr<Cluster> selene_with(
    const std::vector<std::pair<std::string, std::string>>& fields, const std::string& file) {
  std::string text = builtin_clusters()[0].json;
  for (const auto& [key, value] : fields) {
    const std::size_t at = text.find("\"" + key + "\"");
    if (at == std::string::npos) return absl::NotFoundError(key);
    const std::size_t colon = text.find(':', at), end = text.find_first_of(",}", colon);
    text.replace(colon + 1, end - colon - 1, " " + value);
  }
  return parse_cluster(text, file);
}

}  // namespace troupe::launcher::plan
