// The per-rank event recorder (comm/trace.h).
#include "comm/trace.h"

#include <time.h>

#include <algorithm>

namespace troupe::comm::trace {

std::int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kForward:
      return "forward";
    case Kind::kBackward:
      return "backward";
    case Kind::kSend:
      return "send";
    case Kind::kRecv:
      return "recv";
    case Kind::kCollective:
      return "collective";
    case Kind::kPhase:
      return "phase";
    case Kind::kOptimizer:
      return "optimizer";
    case Kind::kWait:
      return "wait";
    case Kind::kStep:
      return "step";
    case Kind::kWeight:
      return "weight";
  }
  return "unknown";
}

const char* what_name(What w) {
  switch (w) {
    case What::kNone:
      return "";
    case What::kActivation:
      return "activation";
    case What::kGradient:
      return "gradient";
    case What::kSlot:
      return "slot";
    case What::kParams:
      return "params";
    case What::kGradients:
      return "gradients";
    case What::kClip:
      return "clip";
    case What::kAdd:
      return "add";
    case What::kNorm:
      return "norm";
    case What::kAdam:
      return "adam";
    case What::kAllReduce:
      return "all_reduce";
    case What::kAllGather:
      return "all_gather";
    case What::kReduceScatter:
      return "reduce-scatter";
    case What::kDirect:
      return "direct";
    case What::kSharedMemory:
      return "shared_memory";
    case What::kBroadcast:
      return "broadcast";
    case What::kTrain:
      return "train";
    case What::kEval:
      return "eval";
  }
  return "unknown";
}

const char* message_name(Tag tag) {
  const TagFields f = parse_tag(tag & ~kAckBit);
  switch (f.kind) {
    case MessageKind::kActivation:
      return "activation";
    case MessageKind::kGradient:
      return "gradient";
    case MessageKind::kGradSlice:
      return "grad-piece";
    case MessageKind::kParamSlice:
      return "param-piece";
    case MessageKind::kCollective:
      return f.group == GroupKind::kTensor ? "tp" : "collective";
    case MessageKind::kControl:
      return "control";
  }
  return "unknown";
}

Recorder::Recorder(std::size_t capacity) : ring_(std::max<std::size_t>(capacity, 1)) {}

void Recorder::set_steps(int first, int last) {
  first_.store(first);
  last_.store(last);
}

void Recorder::push(const Event& e) {
  ring_[next_ % ring_.size()] = e;
  next_++;
}

void Recorder::record(const Event& e) {
  if (!wants(e.step)) return;
  std::lock_guard<std::mutex> lock(mu_);
  push(e);
}

Recorder::Handle Recorder::open(Event e) {
  if (!wants(e.step)) return kNone;
  if (e.begin_ns == 0) e.begin_ns = now_ns();
  e.end_ns = 0;
  std::lock_guard<std::mutex> lock(mu_);
  Handle h;
  if (!free_.empty()) {
    h = free_.back();
    free_.pop_back();
  } else {
    h = static_cast<Handle>(open_.size());
    open_.emplace_back();
  }
  open_[static_cast<std::size_t>(h)] = {e, true};
  return h;
}

void Recorder::close(Handle h, bool failed) {
  if (h == kNone) return;
  const std::int64_t end = now_ns();
  std::lock_guard<std::mutex> lock(mu_);
  if (h < 0 || static_cast<std::size_t>(h) >= open_.size()) return;
  Slot& slot = open_[static_cast<std::size_t>(h)];
  if (!slot.used) return;
  slot.used = false;
  slot.e.end_ns = std::max(end, slot.e.begin_ns);
  slot.e.failed = failed ? 1 : 0;
  push(slot.e);
  free_.push_back(h);
}

bool Recorder::has_open(Kind kind) const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::any_of(open_.begin(), open_.end(),
                     [kind](const Slot& s) { return s.used && s.e.kind == kind; });
}

Recorder::Contents Recorder::contents() const {
  std::lock_guard<std::mutex> lock(mu_);
  Contents c;
  c.capacity = ring_.size();
  c.recorded = next_;
  c.dropped = next_ > ring_.size() ? next_ - ring_.size() : 0;
  const std::uint64_t first = next_ - std::min<std::uint64_t>(next_, ring_.size());
  c.events.reserve(static_cast<std::size_t>(next_ - first));
  for (std::uint64_t i = first; i < next_; i++) c.events.push_back(ring_[i % ring_.size()]);
  for (const Slot& s : open_) {
    if (s.used) c.open.push_back(s.e);
  }
  std::sort(c.open.begin(), c.open.end(),
            [](const Event& a, const Event& b) { return a.begin_ns < b.begin_ns; });
  return c;
}

}  // namespace troupe::comm::trace
