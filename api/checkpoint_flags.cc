// The checkpoint flags: --save (made, writable, locked by whoever commits),
// --load opened and checked against the run, --exit-signal-handler; and
// check_writable for any file a run will write.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "api/flag_rules.h"
#include "model/atomic_file.h"

namespace troupe::api {

absl::Status check_writable(const std::string& path, const char* flag) {
  absl::StatusOr<model::AtomicFile> probe = model::AtomicFile::create(path);
  if (!probe.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": cannot write there (", probe.status().message(), ")"));
  }
  return absl::OkStatus();
}

// Makes directory `dir` (flag `flag`'s) and checks a file can be written in it.
absl::Status make_writable_dir(const std::string& dir, const char* flag) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, " ", dir, ": cannot make the directory",
        ec ? absl::StrCat(" (", ec.message(), ")") : std::string(" (a file is in the way)")));
  }
  return check_writable(dir + "/.probe", flag);
}

absl::Status check_checkpoint_flags(const actors::CheckpointOptions& ck) {
  if (ck.save_interval < 0) {
    return absl::InvalidArgumentError("--save-interval must not be negative");
  }
  if (ck.exit_interval < 0) {
    return absl::InvalidArgumentError("--exit-interval must not be negative");
  }
  if (ck.keep_last < 0) return absl::InvalidArgumentError("--keep-last must not be negative");
  if (ck.save.empty() && (ck.save_interval > 0 || ck.keep_last > 0 || ck.exit_signal_handler)) {
    return absl::InvalidArgumentError(
        "--save-interval, --keep-last and --exit-signal-handler need --save DIR");
  }
  if (!ck.load_optim && ck.load.empty()) {
    return absl::InvalidArgumentError("--no-load-optim needs --load DIR");
  }
  if (!ck.save.empty()) return make_writable_dir(ck.save, "--save");
  return absl::OkStatus();
}

absl::StatusOr<std::optional<model::ckpt::Checkpoint>> open_load(const TrainFlags& f,
                                                                 const model::TrainOptions& o) {
  return open_load(f.checkpoint, o);
}

absl::StatusOr<std::optional<model::ckpt::Checkpoint>> open_load(
    const actors::CheckpointOptions& ck, const model::TrainOptions& o) {
  if (ck.load.empty()) return std::nullopt;
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!ck.save.empty() && fs::equivalent(ck.load, ck.save, ec) &&
      !fs::exists(fs::path(ck.load) / model::ckpt::kTracker, ec) &&
      !fs::exists(fs::path(ck.load) / "manifest.json", ec)) {
    return std::nullopt;  // a job's first start: nothing saved yet
  }
  absl::StatusOr<model::ckpt::Checkpoint> c = model::ckpt::Checkpoint::open(ck.load);
  absl::Status st = c.status();
  if (st.ok()) st = c->check_model(o.model);
  if (st.ok() && ck.load_optim) st = c->check_resume(o);
  if (!st.ok()) return absl::Status(st.code(), absl::StrCat("--load: ", st.message()));
  return std::optional<model::ckpt::Checkpoint>(*std::move(c));
}

std::string describe_load(const TrainFlags& f, const model::ckpt::Checkpoint& c) {
  const model::ckpt::Meta& m = c.meta();
  return absl::StrCat(f.checkpoint.load_optim ? "resuming from " : "parameters from ", c.dir(),
                      " (step ", m.step, ", written with ", m.describe_layout(), " by ", m.writer,
                      ")");
}

namespace {

std::atomic<bool> exit_signal{false};

void on_exit_signal(int) { exit_signal.store(true); }

}  // namespace

void install_exit_signal_handler() {
  struct sigaction sa = {};
  sa.sa_handler = on_exit_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
}

bool exit_signal_received() { return exit_signal.load(); }

}  // namespace troupe::api
