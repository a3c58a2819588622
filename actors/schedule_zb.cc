// ZB-H1 and ZB-V as op lists. Both were checked against a brute-force
// simulation of all stages with unit op times (tests/actors/
// schedule_zb_test.cc): ZB-H1's step is m(F+B+W) + (pp-1)(F+B-W) for
// m >= pp, ZB-V's 6m + pp - 1 chunk-op times for m >= 2pp - 1.
#include "actors/schedule_zb.h"

#include <algorithm>
#include <deque>
#include <utility>

namespace troupe::actors {

namespace {

// Appends ops, numbering each chunk's forwards, B's and W's in order (W's
// in the order of their B's).
class ListBuilder {
 public:
  explicit ListBuilder(int m) : m_(m) {}
  bool can_forward(int c) const { return f_[c] < m_; }
  bool can_backward(int c) const { return b_[c] < f_[c]; }
  int pending_weights() const { return static_cast<int>(w_.size()); }
  int backwards(int c) const { return b_[c]; }
  void forward(int c) { push(OpKind::kForward, f_[c]++, c); }
  void backward(int c) {
    w_.emplace_back(c, b_[c]);
    push(OpKind::kBackward, b_[c]++, c);
  }
  void weight() {
    const auto [c, micro] = w_.front();
    w_.pop_front();
    push(OpKind::kWeight, micro, c);
  }
  std::vector<ScheduleOp> take() {
    for (std::size_t i = 0; i < ops_.size(); i++) ops_[i].id = static_cast<int>(i);
    return std::move(ops_);
  }

 private:
  void push(OpKind kind, int micro, int chunk) { ops_.push_back({kind, micro, chunk, 0}); }
  int m_;
  int f_[2] = {0, 0}, b_[2] = {0, 0};
  std::deque<std::pair<int, int>> w_;  // (chunk, micro) of the B's whose W is to come
  std::vector<ScheduleOp> ops_;
};

}  // namespace

// 1F1B's forwards and B's; the first s B's leave their W pending and every
// later B is followed by the oldest pending W, so stage s enters the
// cool-down with s W's in hand, one for each gap before its next B.
std::vector<ScheduleOp> zbh1_schedule(int pp, int s, int m) {
  ListBuilder l(m);
  const int warmup = std::min(pp - s - 1, m);
  const int deferred = std::min(s, m - warmup);
  for (int k = 0; k < warmup; k++) l.forward(0);
  auto backward = [&] {
    l.backward(0);
    if (l.backwards(0) > deferred) l.weight();
  };
  while (l.can_forward(0)) {
    l.forward(0);
    backward();
  }
  while (l.can_backward(0)) backward();
  while (l.pending_weights() > 0) l.weight();
  return l.take();
}

// Warm-up: chunk 0's forwards for the 2(pp-s)-1 virtual stages downstream
// to fill, then s pairs of chunk 1 and chunk 0 forwards, then pp-s rounds of
// chunk 1's F, B, W (the V's bottom turns round). Steady: F, B, W of chunk
// 0, then of chunk 1. Cool-down: the B's alternate between the chunks, each
// followed by a W while more than s are pending; the rest of the W's last.
std::vector<ScheduleOp> zbv_schedule(int pp, int s, int m) {
  ListBuilder l(m);
  const int warmup = std::min(2 * (pp - s) - 1, m);
  for (int k = 0; k < warmup; k++) l.forward(0);
  for (int k = 0; k < s; k++) {
    if (l.can_forward(1)) l.forward(1);
    if (l.can_forward(0)) l.forward(0);
  }
  auto backward = [&](int c) {
    if (!l.can_backward(c)) return;
    l.backward(c);
    l.weight();
  };
  for (int k = 0; k < pp - s; k++) {
    if (l.can_forward(1)) l.forward(1);
    backward(1);
  }
  while (l.can_forward(0) || l.can_forward(1)) {
    if (l.can_forward(0)) l.forward(0);
    backward(0);
    if (l.can_forward(1)) l.forward(1);
    backward(1);
  }
  while (l.can_backward(0) || l.can_backward(1)) {
    for (int c : {0, 1}) {
      if (!l.can_backward(c)) continue;
      l.backward(c);
      if (l.pending_weights() > s) l.weight();
    }
  }
  while (l.pending_weights() > 0) l.weight();
  return l.take();
}

}  // namespace troupe::actors
