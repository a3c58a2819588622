// The watchers' frames (JSON) and the thread that sends them.
#include "actors/runtime/watch_feed.h"

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/str_cat.h"

namespace troupe::actors {
namespace {

using json = nlohmann::json;

const char* kind_name(WatchEvent::Kind k) {
  switch (k) {
    case WatchEvent::Kind::kHello:
      return "hello";
    case WatchEvent::Kind::kStep:
      return "step";
    case WatchEvent::Kind::kLog:
      return "log";
    case WatchEvent::Kind::kCheckpoint:
      return "checkpoint";
    case WatchEvent::Kind::kEnd:
      return "end";
  }
  return "?";
}

}  // namespace

std::string encode_watch_event(const WatchEvent& e) {
  json j = {{"kind", kind_name(e.kind)}};
  switch (e.kind) {
    case WatchEvent::Kind::kHello:
      j["steps"] = e.steps;
      j["step"] = e.step;
      j["layout"] = e.layout;
      j["model"] = e.model;
      break;
    case WatchEvent::Kind::kStep: {
      const model::StepMetrics& m = e.metrics;
      j["step"] = m.step;
      j["global_batch_size"] = m.global_batch;
      j["consumed_samples"] = m.consumed_samples;
      j["loss"] = m.loss;
      j["grad_norm"] = m.grad_norm;
      j["lr"] = m.lr;
      j["loss_scale"] = m.loss_scale;
      j["skipped"] = m.skipped;
      j["skipped_steps"] = m.skipped_steps;
      j["step_s"] = m.step_s;
      j["tokens_per_s"] = m.tokens_per_s;
      if (m.val_loss) j["val_loss"] = *m.val_loss;
      break;
    }
    case WatchEvent::Kind::kLog:
      j["line"] = e.text;
      break;
    case WatchEvent::Kind::kCheckpoint:
      j["step"] = e.step;
      j["dir"] = e.text;
      break;
    case WatchEvent::Kind::kEnd:
      j["error"] = e.text;
      j["stalled"] = e.stalled;
      break;
  }
  // (A diverged loss is not JSON's: nlohmann writes null, read back as NaN.)
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

absl::StatusOr<WatchEvent> decode_watch_event(const std::string& frame) {
  const json j = json::parse(frame, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("kind") || !j["kind"].is_string()) {
    return absl::DataLossError("a watch frame that is not a JSON object with a kind");
  }
  auto number = [&](const char* key) {
    const auto it = j.find(key);
    return it != j.end() && it->is_number() ? it->get<double>() : std::nan("");
  };
  auto integer = [&](const char* key) -> std::int64_t {
    const auto it = j.find(key);
    return it != j.end() && it->is_number_integer() ? it->get<std::int64_t>() : 0;
  };
  auto text = [&](const char* key) {
    const auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  WatchEvent e;
  const std::string kind = j["kind"].get<std::string>();
  if (kind == "hello") {
    e.kind = WatchEvent::Kind::kHello;
    e.steps = static_cast<int>(integer("steps"));
    e.step = static_cast<int>(integer("step"));
    e.layout = text("layout");
    e.model = text("model");
  } else if (kind == "step") {
    e.kind = WatchEvent::Kind::kStep;
    model::StepMetrics& m = e.metrics;
    m.step = static_cast<int>(integer("step"));
    m.global_batch = static_cast<int>(integer("global_batch_size"));
    m.consumed_samples = integer("consumed_samples");
    m.loss = number("loss");
    m.grad_norm = number("grad_norm");
    m.lr = static_cast<float>(number("lr"));
    // (Feeds of older troupes have neither: fp32, nothing skipped.)
    if (j.contains("loss_scale")) m.loss_scale = static_cast<float>(number("loss_scale"));
    if (j.contains("skipped")) m.skipped = j["skipped"].is_boolean() && j["skipped"].get<bool>();
    if (j.contains("skipped_steps")) m.skipped_steps = static_cast<int>(integer("skipped_steps"));
    m.step_s = number("step_s");
    m.tokens_per_s = number("tokens_per_s");
    if (j.contains("val_loss")) m.val_loss = number("val_loss");
  } else if (kind == "log") {
    e.kind = WatchEvent::Kind::kLog;
    e.text = text("line");
  } else if (kind == "checkpoint") {
    e.kind = WatchEvent::Kind::kCheckpoint;
    e.step = static_cast<int>(integer("step"));
    e.text = text("dir");
  } else if (kind == "end") {
    e.kind = WatchEvent::Kind::kEnd;
    e.text = text("error");
    e.stalled = j.contains("stalled") && j["stalled"].is_boolean() && j["stalled"].get<bool>();
  } else {
    return absl::DataLossError(
        absl::StrCat("a watch frame of an unknown kind: ", kind.substr(0, 40)));
  }
  return e;
}

WatchFeed::WatchFeed() : thread_([this] { loop(); }) {}

WatchFeed::~WatchFeed() { close(); }

void WatchFeed::close() {
  if (!thread_.joinable()) return;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(2),
                 [&] { return hub_ == nullptr || queue_.empty() || ids_.empty(); });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void WatchFeed::start(comm::ControlHub* hub) {
  std::lock_guard<std::mutex> lock(mu_);
  hub_ = hub;
  cv_.notify_all();
}

bool WatchFeed::add(int id, const std::function<std::string(int step)>& hello) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ids_.size() >= kMaxWatchers) return false;
  const std::uint64_t seq = ++seq_;
  ids_[id] = seq;
  queue_.push_back({.to = id, .seq = seq, .frame = hello(step_)});
  cv_.notify_all();
  return true;
}

void WatchFeed::set_step(int step) {
  std::lock_guard<std::mutex> lock(mu_);
  step_ = step;
}

void WatchFeed::remove(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  ids_.erase(id);
  cv_.notify_all();
}

int WatchFeed::watchers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(ids_.size());
}

void WatchFeed::publish(const WatchEvent& e) {
  std::string frame = encode_watch_event(e);
  std::lock_guard<std::mutex> lock(mu_);
  if (e.kind == WatchEvent::Kind::kStep) step_ = e.metrics.step;
  if (ids_.empty()) return;  // nobody listens: nothing is kept
  if (queue_.size() >= kMaxQueued) queue_.pop_front();
  queue_.push_back({.to = -1, .seq = ++seq_, .frame = std::move(frame)});
  cv_.notify_all();
}

void WatchFeed::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || (hub_ != nullptr && !queue_.empty()); });
    if (stop_) return;
    const Out out = std::move(queue_.front());
    queue_.pop_front();
    std::vector<int> to;
    for (const auto& [id, joined] : ids_) {
      if (out.to == id || (out.to == -1 && joined < out.seq)) to.push_back(id);
    }
    comm::ControlHub* hub = hub_;
    lock.unlock();
    // (A watcher that cannot take it is lost: the hub drops it, and
    // on_lost removes it.)
    for (int id : to) {
      if (!hub->send(id, out.frame).ok()) {
        hub->drop(id, absl::UnavailableError("a watcher fell behind"));
      }
    }
    lock.lock();
    if (queue_.empty()) cv_.notify_all();
  }
}

}  // namespace troupe::actors
