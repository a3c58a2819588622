// api::prepare_run: troupe train, launch, worker and JobConfig::from_flags
// turn flags into a run through it; what differs between them is what
// api/prepare_run.h says differs, and nothing else.
#include "api/prepare_run.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace troupe::api {
namespace {

// The flags as a command parses them (the App holds what the flags point to).
struct Parsed {
  std::unique_ptr<CLI::App> app = std::make_unique<CLI::App>("test");
  TrainFlags f;
  explicit Parsed(std::vector<std::string> args) {
    add_train_flags(app.get(), f);
    std::vector<std::string> reversed(args.rbegin(), args.rend());
    app->parse(reversed);
  }
};

absl::StatusOr<PreparedRun> prepare(const std::vector<std::string>& args, Runner runner) {
  Parsed p(args);
  return prepare_run(p.f, {.runner = runner});
}

const Runner kAll[] = {Runner::kTrain, Runner::kLaunch, Runner::kWorker, Runner::kEmbedded};

TEST(PrepareRun, EveryRunnerGivesTheSameErrorsForTheSameFlags) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--tp", "3"}, "--heads 4 does not divide among --tp 3"},
      {{"--bf16", "--fp16"}, "--bf16 and --fp16: give one of them"},
      {{"--recipe", "gpt9"}, "--recipe gpt9: unknown; known: mt-nlg"},
      {{"--schedule", "zigzag"}, "zigzag"},
      {{"--recipe", "mt-nlg", "--dp", "7"}, "(--global-batch-size is --recipe mt-nlg's; give it"},
  };
  for (const auto& [args, want] : bad) {
    std::string first;
    for (Runner r : kAll) {
      absl::StatusOr<PreparedRun> run = prepare(args, r);
      ASSERT_FALSE(run.ok()) << args[0] << " runner " << static_cast<int>(r);
      const std::string got(run.status().message());
      EXPECT_NE(got.find(want), std::string::npos) << got;
      if (first.empty()) first = got;
      EXPECT_EQ(got, first) << "runner " << static_cast<int>(r);
    }
  }
}

TEST(PrepareRun, PrintConfigIsPrintedByTrainAndLaunchAndRefusedByAWorker) {
  for (Runner r : {Runner::kTrain, Runner::kLaunch}) {
    absl::StatusOr<PreparedRun> run = prepare({"--print-config"}, r);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_TRUE(run->printed);
  }
  absl::StatusOr<PreparedRun> worker = prepare({"--print-config"}, Runner::kWorker);
  ASSERT_FALSE(worker.ok());
  EXPECT_EQ(worker.status().message(),
            "--print-config: ask troupe train or troupe launch, not a worker");
  absl::StatusOr<PreparedRun> run = prepare({}, Runner::kTrain);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_FALSE(run->printed);
}

// --save is locked by the process that commits checkpoints (train, launch),
// not by a worker or an embedded job (its Job locks it when it starts).
TEST(PrepareRun, OnlyTheCommittingProcessLocksSave) {
  const std::string root = ::testing::TempDir() + "/prepare_run_lock";
  std::filesystem::remove_all(root);
  for (Runner r : kAll) {
    const std::string dir = root + "/" + std::to_string(static_cast<int>(r));
    absl::StatusOr<PreparedRun> run = prepare({"--save", dir}, r);
    ASSERT_TRUE(run.ok()) << run.status();
    const bool locked = std::filesystem::exists(dir + "/.troupe-save.lock");
    EXPECT_EQ(locked, r == Runner::kTrain || r == Runner::kLaunch) << dir;
  }
  std::filesystem::remove_all(root);
}

// --device's default: resolved by train, a worker and an embedded job for
// their own host; launch leaves it to its placement (a worker on another
// host resolves its own).
TEST(PrepareRun, LaunchLeavesTheDefaultDeviceToItsPlacement) {
  const char* env = std::getenv("TROUPE_DEVICE");
  const std::string saved = env != nullptr ? env : "";
  ::unsetenv("TROUPE_DEVICE");  // (ctest pins it; the default is what is tested)
  for (Runner r : kAll) {
    Parsed p({});
    absl::StatusOr<PreparedRun> run = prepare_run(p.f, {.runner = r});
    ASSERT_TRUE(run.ok()) << run.status();
    if (r == Runner::kLaunch) {
      EXPECT_EQ(p.f.device, "");
    } else {
      EXPECT_FALSE(p.f.device.empty()) << "runner " << static_cast<int>(r);
    }
  }
  if (env != nullptr) ::setenv("TROUPE_DEVICE", saved.c_str(), 1);
}

// --load is opened where a start reads it once: train and a worker.
TEST(PrepareRun, LoadIsOpenedByTrainAndAWorker) {
  const std::string missing = ::testing::TempDir() + "/prepare_run_no_checkpoint";
  std::filesystem::remove_all(missing);
  for (Runner r : kAll) {
    absl::StatusOr<PreparedRun> run = prepare({"--load", missing}, r);
    const bool opens = r == Runner::kTrain || r == Runner::kWorker;
    EXPECT_EQ(run.ok(), !opens) << "runner " << static_cast<int>(r);
    if (opens) {
      EXPECT_NE(run.status().message().find("--load"), std::string::npos) << run.status();
    }
  }
}

}  // namespace
}  // namespace troupe::api
