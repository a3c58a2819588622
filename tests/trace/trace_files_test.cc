// Reading rank trace files: bad input named by file and line, forward
// compatibility, message matching (FIFO per tag), the Chrome JSON's flows,
// the message log.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "launcher/trace/merge.h"
#include "launcher/trace/messages.h"
#include "tests/trace/trace_test_util.h"

namespace troupe::launcher::trace {
namespace {
using namespace testing;  // NOLINT

std::string good_header() { return RankFile{}.text(); }

// The error of parsing `text`, "" if it parses.
std::string error_of(const std::string& text) {
  absl::StatusOr<RankTrace> r = parse_rank_file("d/rank-00000.trace.jsonl", text);
  return r.ok() ? "" : std::string(r.status().message());
}

TEST(TraceFiles, BadFilesNameTheFileAndLine) {
  EXPECT_EQ(error_of(""), "d/rank-00000.trace.jsonl: empty: not a trace");
  EXPECT_EQ(error_of("hello\n"), "d/rank-00000.trace.jsonl:1: not JSON: 'hello'");
  EXPECT_EQ(error_of("{\"format\":\"chrome\"}\n"),
            "d/rank-00000.trace.jsonl:1: not a troupe trace: format \"chrome\"");
  json h = json::parse(good_header());
  h.erase("m");
  EXPECT_EQ(error_of(h.dump() + "\n"), "d/rank-00000.trace.jsonl:1: missing \"m\"");
  h = json::parse(good_header());
  h["rank"] = "zero";
  EXPECT_EQ(error_of(h.dump() + "\n"),
            "d/rank-00000.trace.jsonl:1: \"rank\" has the wrong type: \"zero\"");
  h = json::parse(good_header());
  h["rank"] = 1;  // (0,0,0) of a 1-rank layout is rank 0
  EXPECT_EQ(error_of(h.dump() + "\n"),
            "d/rank-00000.trace.jsonl:1: rank 1 but (d,s,t) = (0,0,0) is rank 0");
  EXPECT_EQ(error_of(good_header() + "{\"k\":\"forward\",\"e\":5,\"step\":1}\n"),
            "d/rank-00000.trace.jsonl:2: missing \"b\"");
  EXPECT_EQ(error_of(good_header() + "{\"k\":\"forward\",\"b\":9,\"e\":5,\"step\":1}\n"),
            "d/rank-00000.trace.jsonl:2: ends (5) before it begins (9)");
  EXPECT_EQ(error_of(good_header() + "{\"k\":\"send\",\"b\":1,\"e\":5,\"step\":1,\"peer\":1}\n"),
            "d/rank-00000.trace.jsonl:2: missing \"tag\"");
  EXPECT_EQ(
      error_of(good_header() + "{\"k\":\"forward\",\"b\":1,\"e\":5,\"st"),
      "d/rank-00000.trace.jsonl:2: the last line has no newline: the file was cut off (truncated)");
  EXPECT_EQ(error_of(good_header() + "[1,2]\n"),
            "d/rank-00000.trace.jsonl:2: an event must be a JSON object");
}

// Every prefix of a good file (a writer cut off at any byte) and every
// single-byte change of it parse or give an error naming the file: never
// a crash, never an error without the file's name.
TEST(TraceFiles, CutOrDamagedAnywhereIsAnErrorNamingTheFile) {
  RankFile f{.h = {.rank = 1, .s = 1, .pp = 2}, .events = {}};
  f.add(op("forward", 0, 10, 1, 0));
  f.add(message("recv", 0, 10, 1, 0, "activation", 0, "0xa0"));
  f.add(open_event(step_event(0, 0, 2)));
  const std::string text = f.text();
  int errors = 0;
  auto check = [&errors](const std::string& t) {
    absl::StatusOr<RankTrace> r = parse_rank_file("x/rank-00001.trace.jsonl", t);
    if (!r.ok()) {
      errors++;
      EXPECT_TRUE(absl::StartsWith(r.status().message(), "x/rank-00001.trace.jsonl")) << r.status();
    }
  };
  // A prefix of whole lines is a shorter file that parses; any other is cut.
  for (std::size_t n = 0; n < text.size(); n++) {
    const int before = errors;
    check(text.substr(0, n));
    const bool whole_lines = n > 0 && text[n - 1] == '\n';
    EXPECT_EQ(errors - before, whole_lines ? 0 : 1) << "prefix of " << n << " bytes";
  }
  for (std::size_t i = 0; i < text.size(); i++) {
    for (char c : {'x', '"', '}', '\n', '\0', '9'}) {
      std::string t = text;
      t[i] = c;
      check(t);
    }
  }
}

TEST(TraceFiles, UnknownKindsAndKeysAreIgnored) {
  std::string text = good_header() +
                     "{\"k\":\"forward\",\"b\":1,\"e\":5,\"step\":1,\"mb\":0,\"new_key\":[1]}\n"
                     "{\"k\":\"gpu-kernel\",\"b\":1,\"e\":2,\"step\":1}\n";
  absl::StatusOr<RankTrace> r = parse_rank_file("f", text);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->events.size(), 1u);
  EXPECT_EQ(r->skipped_unknown, 1);
  EXPECT_EQ(r->events[0].duration(), 4);
}

TEST(TraceFiles, ReadsADirectoryAndChecksNamesAgainstHeaders) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "trace_dir_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  RankFile r0{.h = {.rank = 0, .s = 0, .pp = 2}, .events = {}};
  RankFile r1{.h = {.rank = 1, .s = 1, .pp = 2}, .events = {}};
  std::ofstream(dir / "rank-00000.trace.jsonl") << r0.text();
  std::ofstream(dir / "notes.txt") << "not a rank file, not read";
  absl::StatusOr<Trace> t = read_trace(dir.string());
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->warnings.size(), 1u);
  EXPECT_EQ(t->warnings[0], "1 of 2 ranks wrote no file: 1");
  std::ofstream(dir / "rank-00002.trace.jsonl") << r1.text();
  t = read_trace(dir.string());
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(
      absl::StrContains(t.status().message(), "rank-00002.trace.jsonl:1: the header says rank 1"))
      << t.status();
  EXPECT_FALSE(read_trace((dir / "none").string()).ok());
}

// Two messages rank 0 -> rank 1 with one tag: paired in post order (FIFO),
// whatever order they completed in. Send A posted at 1, B at 5; B's send
// completes first, so the file lists it first. Receives: posted at 0
// (completes at 3) and at 2 (completes at 8): A -> the first, latency 3-1,
// B -> the second, latency 8-5. A third send has no receive.
TEST(TraceMessages, DuplicateTagsMatchInPostOrderAndUnmatchedAreReported) {
  RankFile r0{.h = {.rank = 0, .s = 0, .pp = 2}, .events = {}};
  RankFile r1{.h = {.rank = 1, .s = 1, .pp = 2}, .events = {}};
  r0.add(message("send", 5, 5.5, 1, 1, "activation", 1, "0x7"));
  r0.add(message("send", 1, 6, 1, 1, "activation", 0, "0x7"));
  r0.add(message("send", 9, 9.5, 1, 1, "gradient", 2, "0x9"));
  r1.add(message("recv", 0, 3, 1, 0, "activation", 0, "0x7"));
  r1.add(message("recv", 2, 8, 1, 0, "activation", 1, "0x7"));
  Trace t = assemble({r0, r1});
  std::vector<Message> ms = match_messages(t);
  ASSERT_EQ(ms.size(), 3u);
  ASSERT_TRUE(ms[0].matched() && ms[1].matched());
  EXPECT_EQ(event_of(t, *ms[0].send).b, ns(1));
  EXPECT_EQ(event_of(t, *ms[0].recv).e, ns(3));
  EXPECT_EQ(event_of(t, *ms[1].send).b, ns(5));
  EXPECT_EQ(event_of(t, *ms[1].recv).e, ns(8));
  EXPECT_FALSE(ms[2].matched());
  const std::string log = message_log(t, ms, {});
  EXPECT_NE(log.find("latency 2.000 ms"), std::string::npos) << log;
  EXPECT_NE(log.find("latency 3.000 ms"), std::string::npos) << log;
  EXPECT_NE(log.find("UNMATCHED: no receive on rank 1 (tag 0x9)"), std::string::npos) << log;
  // Origin 0 (the first receive's post): times 1, 5, 9 ms.
  EXPECT_TRUE(absl::StartsWith(log, "     1.000 ms    0 -> 1    activation  step 1   mb 0")) << log;
  auto lines = [](const std::string& s) { return std::count(s.begin(), s.end(), '\n'); };
  const std::string mb1 =
      message_log(t, ms, {.rank = std::nullopt, .micro_batch = 1, .kind = std::nullopt});
  EXPECT_EQ(lines(mb1), 1) << mb1;
  EXPECT_NE(mb1.find("step 1   mb 1 "), std::string::npos) << mb1;
  const std::string grads =
      message_log(t, ms, {.rank = 1, .micro_batch = std::nullopt, .kind = "gradient"});
  EXPECT_EQ(lines(grads), 1) << grads;
  EXPECT_NE(grads.find("gradient"), std::string::npos) << grads;
  EXPECT_EQ(message_log(t, ms, {.rank = 5, .micro_batch = std::nullopt, .kind = std::nullopt}), "");
}

TEST(TraceMerge, ChromeJsonHasAProcessPerRankAndAFlowPerMatchedMessage) {
  RankFile r0{.h = {.rank = 0, .s = 0, .pp = 2, .uncertainty_ns = 1500, .host = "a"}, .events = {}};
  RankFile r1{.h = {.rank = 1, .s = 1, .pp = 2, .host = "b"}, .events = {}};
  r0.add(op("forward", 0, 10, 1, 0));
  r0.add(message("send", 10, 11, 1, 1, "activation", 0, "0x1"));
  r0.add(message("send", 12, 13, 1, 1, "activation", 1, "0x2"));  // never received
  r1.add(message("recv", 0, 11, 1, 0, "activation", 0, "0x1"));
  r1.add(open_event(op("forward", 11, 0, 1, 0)));
  Trace t = assemble({r0, r1});
  json j = json::parse(chrome_json(t, match_messages(t)));
  int complete = 0, starts = 0, finishes = 0;
  std::map<int, std::string> names;
  for (const json& e : j["traceEvents"]) {
    const std::string ph = e["ph"];
    if (ph == "X") complete++;
    if (ph == "s") {
      starts++;
      EXPECT_EQ(e["pid"], 0);
      EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 10'000.0);  // us: the send's post
    }
    if (ph == "f") {
      finishes++;
      EXPECT_EQ(e["pid"], 1);
      EXPECT_EQ(e["bp"], "e");
    }
    if (ph == "X" && e["name"] == "forward mb 0 (open)") {
      EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 2'000.0);  // to the trace's end, 13 ms
    }
    if (ph == "M" && e["name"] == "process_name") names[e["pid"]] = e["args"]["name"];
  }
  EXPECT_EQ(complete, 5);
  EXPECT_EQ(starts, 1);
  EXPECT_EQ(finishes, 1);
  EXPECT_EQ(names[0], "rank 0 (0,0,0) a");
  EXPECT_EQ(names[1], "rank 1 (0,1,0) b");
  EXPECT_EQ(j["otherData"]["clock_uncertainty_ns"], 1500);
  EXPECT_EQ(j["otherData"]["unmatched_messages"], 1);
}

// Two sends in flight together (0-10 and 5-15) and a third after them
// (12-20): a thread's slices must nest, so the second goes to a lane of its
// own ("sends (2)", tid 5001) and the third back to the first lane; each
// flow starts on its send's lane.
TEST(TraceMerge, OverlappingMessagesGoToLanesSoSlicesNest) {
  RankFile r0{.h = {.rank = 0, .s = 0, .pp = 2}, .events = {}};
  RankFile r1{.h = {.rank = 1, .s = 1, .pp = 2}, .events = {}};
  r0.add(message("send", 0, 10, 1, 1, "activation", 0, "0x1"));
  r0.add(message("send", 5, 15, 1, 1, "activation", 1, "0x2"));
  r0.add(message("send", 12, 20, 1, 1, "activation", 2, "0x3"));
  r1.add(message("recv", 0, 10, 1, 0, "activation", 0, "0x1"));
  r1.add(message("recv", 0, 15, 1, 0, "activation", 1, "0x2"));
  r1.add(message("recv", 0, 20, 1, 0, "activation", 2, "0x3"));
  Trace t = assemble({r0, r1});
  json j = json::parse(chrome_json(t, match_messages(t)));
  std::map<std::string, int> slice_tid;  // rank 0's send slices by name
  std::map<int, int> flow_tid;           // flow id -> tid of its start
  std::map<int, std::string> thread_names;
  for (const json& e : j["traceEvents"]) {
    if (e["pid"] != 0) continue;
    if (e["ph"] == "X") slice_tid[e["name"]] = e["tid"];
    if (e["ph"] == "s") flow_tid[e["id"]] = e["tid"];
    if (e["ph"] == "M" && e["name"] == "thread_name") thread_names[e["tid"]] = e["args"]["name"];
  }
  EXPECT_EQ(slice_tid["send activation mb 0 to 1"], 5);
  EXPECT_EQ(slice_tid["send activation mb 1 to 1"], 5001);
  EXPECT_EQ(slice_tid["send activation mb 2 to 1"], 5);
  EXPECT_EQ(thread_names[5001], "sends (2)");
  EXPECT_EQ(flow_tid, (std::map<int, int>{{1, 5}, {2, 5001}, {3, 5}}));
}

// A wait is drawn on the track of whoever waits: the compute stream's at
// an op's gate between its ops, the shard actor's and the optimizer
// actor's on theirs.
TEST(TraceMerge, AStreamsWaitAtAGateIsOnTheComputeTrack) {
  RankFile r0{.h = {.rank = 0, .s = 0, .pp = 1}, .events = {}};
  auto wait = [](const char* actor, double b, double e, const char* what) {
    return json{{"k", "wait"},  {"b", b},    {"e", e},  {"step", 1}, {"actor", actor},
                {"what", what}, {"peer", 1}, {"mb", 0}, {"chunk", 0}};
  };
  r0.add(wait("stream", 0, 4, "activation"));
  r0.add(op("forward", 4, 10, 1, 0));
  r0.add(wait("shard", 2, 12, "slot"));
  r0.add(wait("optimizer", 1, 3, "gradients"));
  Trace t = assemble({r0});
  json j = json::parse(chrome_json(t, match_messages(t)));
  std::map<std::string, int> tid;
  std::map<int, std::string> thread_names;
  for (const json& e : j["traceEvents"]) {
    if (e["ph"] == "X") tid[e["name"]] = e["tid"];
    if (e["ph"] == "M" && e["name"] == "thread_name") thread_names[e["tid"]] = e["args"]["name"];
  }
  ASSERT_EQ(tid.size(), 4u) << j.dump();
  for (const auto& [name, id] : tid) {
    const std::string expected =
        name.find("forward") != std::string::npos || name.find("activation") != std::string::npos
            ? "compute stream"
        : name.find("slot") != std::string::npos ? "shard actor"
                                                 : "optimizer actor";
    EXPECT_EQ(thread_names[id], expected) << name;
  }
}

}  // namespace
}  // namespace troupe::launcher::trace
