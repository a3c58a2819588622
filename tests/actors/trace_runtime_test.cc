// What the runtime records (comm/trace.h, actors/diagnostics/trace_file.h): the rank
// files of a real pipeline run, checked against what a 1F1B step of pp = 4,
// m = 8 must contain (worked out by hand below), and the flight recorder of
// a planted stall.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "actors/runtime/in_process.h"
#include "tests/tiny_model.h"

namespace troupe::actors {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

model::TrainOptions traced_tiny(int m, int steps) {
  return fixtures::tiny({.layers = 4, .micro_batch = 1, .global_batch = m, .steps = steps});
}

struct RankFile {
  json header;
  std::vector<json> events;
};

std::vector<RankFile> read_dir(const std::string& dir, int world) {
  std::vector<RankFile> out;
  for (int r = 0; r < world; r++) {
    std::ifstream in(fs::path(dir) / trace_file_name(r));
    EXPECT_TRUE(in) << dir << ": no file of rank " << r;
    RankFile f;
    std::string line;
    std::getline(in, line);
    f.header = json::parse(line);
    while (std::getline(in, line)) f.events.push_back(json::parse(line));
    out.push_back(std::move(f));
  }
  return out;
}

std::string fresh_dir(const std::string& name) {
  const fs::path p =
      fs::temp_directory_path() / absl::StrCat("troupe-trace-test-", name, "-", getpid());
  fs::remove_all(p);
  return p.string();
}

// 1F1B at pp = 4, m = 8, as Megatron orders it: stage s runs pp - s - 1
// warm-up forwards, then alternates one forward and one backward, then the
// remaining backwards. Stage 0: F0 F1 F2 | F3 B0 F4 B1 ... F7 B4 | B5 B6 B7.
std::vector<std::string> one_f_one_b(int s) {
  const int pp = 4, m = 8, warm = pp - s - 1;
  std::vector<std::string> ops;
  int f = 0, b = 0;
  for (; f < warm; f++) ops.push_back(absl::StrCat("F", f));
  for (; f < m; f++, b++) {
    ops.push_back(absl::StrCat("F", f));
    ops.push_back(absl::StrCat("B", b));
  }
  for (; b < m; b++) ops.push_back(absl::StrCat("B", b));
  return ops;
}

TEST(TraceRuntime, A1F1BRunRecordsEveryOpInOrderAndEveryMessageOnBothSides) {
  const int pp = 4, m = 8, steps = 2;
  const std::string dir = fresh_dir("1f1b");
  TraceOptions trace;
  trace.dir = dir;
  auto t = InProcessTrainer::create(traced_tiny(m, steps), {{.pp = pp}}, nullptr, {}, trace);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->run([](const model::StepMetrics&) {}).ok());
  const std::vector<RankFile> files = read_dir(dir, pp);
  // (src, dst, tag) -> [sends, receives]
  std::map<std::tuple<int, int, std::string>, std::pair<int, int>> messages;
  int activations = 0, gradients = 0, grad_pieces = 0, param_pieces = 0;
  for (int r = 0; r < pp; r++) {
    const json& h = files[static_cast<std::size_t>(r)].header;
    EXPECT_EQ(h["format"], "troupe-trace");
    EXPECT_EQ(h["rank"], r);
    EXPECT_EQ(h["s"], r);
    EXPECT_EQ(h["m"], m);
    EXPECT_EQ(h["schedule"], "1f1b");
    EXPECT_EQ(h["reason"], "end");
    EXPECT_EQ(h["layout"]["pp"], pp);
    EXPECT_EQ(h["dropped"], 0);
    std::map<int, std::vector<std::pair<std::int64_t, std::string>>> ops;  // by step
    std::int64_t last_end = 0;
    std::vector<std::pair<std::int64_t, std::int64_t>> spans;
    for (const json& e : files[static_cast<std::size_t>(r)].events) {
      EXPECT_FALSE(e.contains("open")) << e.dump();
      const std::string k = e["k"];
      if (k == "forward" || k == "backward") {
        ops[e["step"]].emplace_back(e["b"],
                                    absl::StrCat(k == "forward" ? "F" : "B", e["mb"].get<int>()));
        spans.emplace_back(e["b"], e["e"]);
        EXPECT_EQ(e["vs"], r);
      } else if (k == "send" || k == "recv") {
        const int peer = e["peer"];
        auto key = k == "send" ? std::make_tuple(r, peer, e["tag"].get<std::string>())
                               : std::make_tuple(peer, r, e["tag"].get<std::string>());
        (k == "send" ? messages[key].first : messages[key].second)++;
        EXPECT_EQ(e["status"], "ok");
        if (k == "send" && e["msg"] == "activation") {
          activations++;
          EXPECT_EQ(peer, r + 1);
        }
        if (k == "send" && e["msg"] == "gradient") {
          gradients++;
          EXPECT_EQ(peer, r - 1);
        }
        // With dp 1 a rank's gradients and parameters stay on its streams
        // (RankUnit: dp_alone); only the tied wte's travel, between the
        // head's stage and the embedding's.
        if (k == "send" && e["msg"] == "grad-piece") {
          grad_pieces++;
          EXPECT_EQ(r, pp - 1);
          EXPECT_EQ(peer, 0);
        }
        if (k == "send" && e["msg"] == "param-piece") {
          param_pieces++;
          EXPECT_EQ(r, 0);
          EXPECT_EQ(peer, pp - 1);
        }
        EXPECT_NE(peer, r) << "a message to itself: " << e.dump();
      }
      last_end = std::max<std::int64_t>(last_end, e["e"]);
    }
    ASSERT_EQ(ops.size(), static_cast<std::size_t>(steps)) << "rank " << r;
    for (auto& [step, list] : ops) {
      std::sort(list.begin(), list.end());
      std::vector<std::string> names;
      for (const auto& [b, n] : list) names.push_back(n);
      EXPECT_EQ(names, one_f_one_b(r)) << "rank " << r << " step " << step;
    }
    // One stream: its ops never overlap.
    std::sort(spans.begin(), spans.end());
    for (std::size_t i = 1; i < spans.size(); i++) EXPECT_GE(spans[i].first, spans[i - 1].second);
  }
  // Every activation goes s -> s+1 and every gradient back, m a step.
  EXPECT_EQ(activations, (pp - 1) * m * steps);
  EXPECT_EQ(gradients, (pp - 1) * m * steps);
  EXPECT_EQ(grad_pieces, steps);
  EXPECT_EQ(param_pieces, steps);
  for (const auto& [key, n] : messages) {
    EXPECT_EQ(n.first, 1) << std::get<2>(key);
    EXPECT_EQ(n.second, 1) << std::get<2>(key);
  }
  fs::remove_all(dir);
}

// With TP too: the TP collectives, their phases and messages (whose tags
// carry no step) are the window's as well, nothing else is recorded.
TEST(TraceRuntime, TraceStepsKeepsOnlyThatWindow) {
  const std::string dir = fresh_dir("window");
  TraceOptions trace;
  trace.dir = dir;
  trace.first_step = trace.last_step = 2;
  auto t = InProcessTrainer::create(traced_tiny(4, 3), {{.tp = 2, .pp = 2}}, nullptr, {}, trace);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->run([](const model::StepMetrics&) {}).ok());
  for (const RankFile& f : read_dir(dir, 4)) {
    EXPECT_EQ(f.header["trace_steps"], json::array({2, 2}));
    int forwards = 0, collectives = 0, tp_messages = 0;
    for (const json& e : f.events) {
      EXPECT_EQ(e["step"], 2) << e.dump();
      forwards += e["k"] == "forward";
      collectives += e["k"] == "collective";
      tp_messages += e.contains("msg") && e["msg"] == "tp";
    }
    EXPECT_EQ(forwards, 4);  // m = 4 of step 2
    EXPECT_GT(collectives, 0);
    EXPECT_GT(tp_messages, 0);
  }
  fs::remove_all(dir);
}

TEST(TraceRuntime, RemoveTraceFilesRemovesOnlyRankFiles) {
  const std::string dir = fresh_dir("remove");
  fs::create_directories(dir);
  for (const char* name : {"rank-00003.trace.jsonl", "rank-3.trace.jsonl", "metrics.jsonl",
                           "rank-00003.trace.jsonl.keep", "notes.txt"}) {
    std::ofstream(fs::path(dir) / name) << "x\n";
  }
  remove_trace_files(dir);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"metrics.jsonl", "notes.txt",
                                            "rank-00003.trace.jsonl.keep", "rank-3.trace.jsonl"}));
  fs::remove_all(dir);
}

TEST(TraceRuntime, AStallWritesTheFlightRecorderAndItShowsWhoWaitsForWhom) {
  const std::string dir = fresh_dir("stall");
  TraceOptions trace;
  trace.flight_dir = dir;
  ParallelOptions par{{.pp = 4}};
  par.fail = {.stage = 2, .step = 2, .kind = FailPoint::Kind::kStall};
  par.stall_timeout_s = 1;
  auto t = InProcessTrainer::create(traced_tiny(8, 3), par, nullptr, {}, trace);
  ASSERT_TRUE(t.ok()) << t.status();
  const absl::Status st = (*t)->run([](const model::StepMetrics&) {});
  ASSERT_TRUE(absl::IsDeadlineExceeded(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), absl::StrCat("flight recorder: ", dir))) << st;
  const std::vector<RankFile> files = read_dir(dir, 4);
  for (const RankFile& f : files) {
    EXPECT_EQ(f.header["reason"], "stall");
    EXPECT_EQ(f.header["capacity"], TraceOptions::kFlightEvents);
  }
  auto open_of = [&](int r, const std::string& kind) {
    std::vector<json> out;
    for (const json& e : files[static_cast<std::size_t>(r)].events) {
      if (e.contains("open") && e["k"] == kind) out.push_back(e);
    }
    return out;
  };
  // Rank 2 never began step 2: no step of it, nothing of step 2 open.
  for (const json& e : files[2].events) {
    EXPECT_FALSE(e["k"] == "step" && e["step"] == 2) << e.dump();
  }
  // Rank 3's stream waits for micro-batch 0's activation from rank 2 (its
  // forwards are fired, behind their receives' gates, as far as its slots
  // go; the actor waits for a slot); rank 1's for the gradient of
  // micro-batch 0 from rank 2 (it has done its forwards).
  bool rank3_waits_on_2 = false;
  for (const json& e : open_of(3, "wait")) {
    rank3_waits_on_2 = rank3_waits_on_2 || (e["what"] == "activation" && e["peer"] == 2 &&
                                            e["mb"] == 0 && e["actor"] == "stream");
  }
  EXPECT_TRUE(rank3_waits_on_2);
  bool rank1_waits_on_2 = false;
  for (const json& e : open_of(1, "wait")) {
    rank1_waits_on_2 = rank1_waits_on_2 || (e["what"] == "gradient" && e["peer"] == 2);
  }
  EXPECT_TRUE(rank1_waits_on_2);
  bool posted_to_2 = false;
  for (const json& e : open_of(1, "send")) posted_to_2 = posted_to_2 || e["peer"] == 2;
  EXPECT_TRUE(posted_to_2) << "rank 1's activations to rank 2 are never received";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace troupe::actors
