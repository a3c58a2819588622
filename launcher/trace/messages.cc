// Pairing sends with receives, and the message log (launcher/trace/messages.h).
#include "launcher/trace/messages.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace troupe::launcher::trace {
namespace {

using Key = std::tuple<int, int, std::string>;  // (from, to, tag)

// Sides of one (from, to, tag), each list in post order.
struct Sides {
  std::vector<EventRef> sends, recvs;
};

void sort_by_post(const Trace& t, std::vector<EventRef>* refs) {
  std::stable_sort(refs->begin(), refs->end(),
                   [&t](EventRef a, EventRef b) { return event_of(t, a).b < event_of(t, b).b; });
}

double ms(std::int64_t ns) { return static_cast<double>(ns) / 1e6; }

std::int64_t when(const Trace& t, const Message& m) {
  return m.send ? event_of(t, *m.send).b : event_of(t, *m.recv).b;
}

bool keep(const Trace& t, const Message& m, const MessageFilter& f) {
  const Event& ev = event_of(t, m.send ? *m.send : *m.recv);
  if (f.rank && m.from != *f.rank && m.to != *f.rank) return false;
  if (f.micro_batch && ev.mb != *f.micro_batch) return false;
  if (f.kind && ev.msg != *f.kind) return false;
  return true;
}

std::string line_of(const Trace& t, const Message& m, std::int64_t origin) {
  const Event& ev = event_of(t, m.send ? *m.send : *m.recv);
  std::string head = absl::StrFormat("%10.3f ms  %3d -> %-3d  %-11s step %-3d mb %-3s %10d B",
                                     ms(when(t, m) - origin), m.from, m.to, ev.msg, ev.step,
                                     ev.mb >= 0 ? absl::StrCat(ev.mb) : std::string("-"), ev.bytes);
  if (m.matched()) {
    const Event& r = event_of(t, *m.recv);
    if (r.open) return absl::StrCat(head, "  in flight: the receive never completed");
    if (!r.status.empty() && r.status != "ok") return absl::StrCat(head, "  failed: ", r.status);
    return absl::StrCat(head,
                        absl::StrFormat("  latency %.3f ms", ms(r.e - event_of(t, *m.send).b)));
  }
  if (m.send) {
    return absl::StrCat(
        head, absl::StrFormat("  UNMATCHED: no receive on rank %d (tag %s)", m.to, m.tag));
  }
  return absl::StrCat(head, absl::StrFormat("  UNMATCHED: no send on rank %d (tag %s)%s", m.from,
                                            m.tag, ev.open ? ", the receive waits" : ""));
}

}  // namespace

const Event& event_of(const Trace& t, EventRef ref) {
  return t.ranks[static_cast<std::size_t>(ref.rank)].events[static_cast<std::size_t>(ref.index)];
}

std::vector<Message> match_messages(const Trace& t) {
  // EventRef::rank indexes Trace::ranks here (its position), turned into the
  // global rank only through the events' own fields.
  std::map<Key, Sides> sides;
  for (std::size_t i = 0; i < t.ranks.size(); i++) {
    const RankTrace& r = t.ranks[i];
    for (std::size_t j = 0; j < r.events.size(); j++) {
      const Event& ev = r.events[j];
      const EventRef ref{static_cast<int>(i), static_cast<int>(j)};
      if (ev.kind == Kind::kSend) sides[{r.header.rank, ev.peer, ev.tag}].sends.push_back(ref);
      if (ev.kind == Kind::kRecv) sides[{ev.peer, r.header.rank, ev.tag}].recvs.push_back(ref);
    }
  }
  std::vector<Message> matched, lone_sends, lone_recvs;
  for (auto& [key, s] : sides) {
    sort_by_post(t, &s.sends);
    sort_by_post(t, &s.recvs);
    const auto& [from, to, tag] = key;
    const std::size_t n = std::min(s.sends.size(), s.recvs.size());
    // Which end of the longer side has no partners: the front where the
    // other side's ring dropped its oldest events (the partners of the
    // oldest were lost), else the back (the newest, not yet posted on the
    // other side when the files were written). Pairing from the wrong end
    // would shift every pair of a repeated tag by one.
    auto dropped = [&t](const std::vector<EventRef>& refs) {
      return !refs.empty() && t.ranks[static_cast<std::size_t>(refs[0].rank)].header.dropped > 0;
    };
    const bool sends_first = s.sends.size() > n && dropped(s.recvs);
    const bool recvs_first = s.recvs.size() > n && dropped(s.sends);
    const std::size_t si = sends_first ? s.sends.size() - n : 0;
    const std::size_t ri = recvs_first ? s.recvs.size() - n : 0;
    for (std::size_t i = 0; i < n; i++) {
      matched.push_back({from, to, tag, s.sends[si + i], s.recvs[ri + i]});
    }
    for (std::size_t i = 0; i < s.sends.size(); i++) {
      if (i >= si && i < si + n) continue;
      lone_sends.push_back({from, to, tag, s.sends[i], std::nullopt});
    }
    for (std::size_t i = 0; i < s.recvs.size(); i++) {
      if (i >= ri && i < ri + n) continue;
      lone_recvs.push_back({from, to, tag, std::nullopt, s.recvs[i]});
    }
  }
  auto by_time = [&t](const Message& a, const Message& b) { return when(t, a) < when(t, b); };
  std::stable_sort(matched.begin(), matched.end(), by_time);
  std::stable_sort(lone_sends.begin(), lone_sends.end(), by_time);
  std::stable_sort(lone_recvs.begin(), lone_recvs.end(), by_time);
  matched.insert(matched.end(), lone_sends.begin(), lone_sends.end());
  matched.insert(matched.end(), lone_recvs.begin(), lone_recvs.end());
  return matched;
}

InputIndex::InputIndex(const Trace& t, const std::vector<Message>& ms) : t_(t) {
  for (const Message& m : ms) {
    if (!m.matched()) continue;
    const Event& r = event_of(t, *m.recv);
    if (r.open || (r.msg != "activation" && r.msg != "gradient")) continue;
    by_key_[{m.recv->rank, r.msg == "gradient", r.step, r.mb}].push_back(&m);
  }
}

const Message* InputIndex::input_of(int rank_index, const Event& op) const {
  if (!op.compute() || op.kind == Kind::kWeight) return nullptr;  // W reads no message
  auto it = by_key_.find({rank_index, op.kind == Kind::kBackward, op.step, op.mb});
  if (it == by_key_.end()) return nullptr;
  const Message* best = nullptr;
  for (const Message* m : it->second) {
    const Event& r = event_of(t_, *m->recv);
    if (r.e > op.b + kSlackNs) continue;
    if (best == nullptr || r.e > event_of(t_, *best->recv).e) best = m;
  }
  return best;
}

std::string message_log(const Trace& t, const std::vector<Message>& ms, const MessageFilter& f) {
  std::vector<const Message*> rows;
  for (const Message& m : ms) {
    if (keep(t, m, f)) rows.push_back(&m);
  }
  std::stable_sort(rows.begin(), rows.end(),
                   [&t](const Message* a, const Message* b) { return when(t, *a) < when(t, *b); });
  const std::int64_t origin = t.origin();
  std::string out;
  for (const Message* m : rows) absl::StrAppend(&out, line_of(t, *m, origin), "\n");
  return out;
}

}  // namespace troupe::launcher::trace
