// Pipeline links device to device (actors/rank/pipeline_link.h).
#include "actors/rank/pipeline_link.h"

#include <algorithm>
#include <set>
#include <stdexcept>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gpu/ops.h"

namespace troupe::actors {

using comm::MessageKind;

namespace {

const char* kind_name(MessageKind kind) {
  return kind == MessageKind::kActivation ? "activation" : "gradient";
}

absl::Status not_connected(const PipelineLinks::Key& k) {
  return absl::FailedPreconditionError(
      absl::StrCat("the pipeline link from rank ", k.from, " to rank ", k.to,
                   " has no channel (RankUnit::connect() makes them)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PipelineLinks>> PipelineLinks::create(gpu::Device& dev,
                                                                     const comm::Layout& layout,
                                                                     const comm::Layout& shape,
                                                                     int rank) {
  std::unique_ptr<PipelineLinks> links(new PipelineLinks());
  links->rank_ = rank;
  const comm::Coord me = layout.coord(rank);
  auto rank_of = [&](int vs) { return layout.rank({me.d, shape.stage_of(vs), me.t}); };
  // Every chunk's neighbours: its forward's input and output, its
  // backward's the other way.
  std::set<Key> keys;
  for (int c = 0; c < shape.virtual_stages; c++) {
    const int vs = shape.virtual_stage(me.s, c);
    if (vs > 0) {
      keys.insert({MessageKind::kActivation, rank_of(vs - 1), rank});
      keys.insert({MessageKind::kGradient, rank, rank_of(vs - 1)});
    }
    if (vs + 1 < shape.chunks()) {
      keys.insert({MessageKind::kActivation, rank, rank_of(vs + 1)});
      keys.insert({MessageKind::kGradient, rank_of(vs + 1), rank});
    }
  }
  for (const Key& k : keys) {
    Link l;
    l.key = k;
    if (k.from == k.to) {
      l.self = true;
      links->links_.push_back(std::move(l));
      continue;
    }
    l.stream = dev.make_stream({.threads = 1});
    l.event = dev.make_event();
    if (absl::Status st = l.stream->status(); !st.ok()) {
      return absl::Status(st.code(), absl::StrCat("the stream of the pipeline link from rank ",
                                                  k.from, " to rank ", k.to, ": ", st.message()));
    }
    links->links_.push_back(std::move(l));
  }
  return links;
}

absl::Status PipelineLinks::warm_up(gpu::Device& dev) {
  for (Link& l : links_) {
    if (l.self) continue;
    const gpu::Tensor one = gpu::Tensor::empty(dev, gpu::DType::kF32, {1});
    gpu::ops::fill(*l.stream, one, 0.0f);
    const bool out = l.key.from == rank_;
    l.stream->device_call(out ? "warm-up send" : "warm-up receive", {one},
                          [ch = l.channel, peer = l.peer, key = l.key, one, out](void* native) {
                            if (ch == nullptr) return not_connected(key);
                            return out ? ch->send_on(native, one.raw(), one.nbytes(), peer)
                                       : ch->recv_on(native, one.raw(), one.nbytes(), peer);
                          });
    if (absl::Status st = l.stream->synchronize(); !st.ok()) {
      return absl::Status(st.code(), absl::StrCat("the pipeline link from rank ", l.key.from,
                                                  " to rank ", l.key.to, ": ", st.message()));
    }
  }
  return absl::OkStatus();
}

PipelineLinks::~PipelineLinks() { synchronize(); }

std::vector<PipelineLinks::Key> PipelineLinks::keys() const {
  std::vector<Key> out;
  for (const Link& l : links_) {
    if (!l.self) out.push_back(l.key);
  }
  return out;
}

void PipelineLinks::set_channel(const Key& key, comm::StreamPointToPoint* channel, int peer,
                                std::shared_ptr<void> keep) {
  Link& l = find(key);
  l.channel = channel;
  l.peer = peer;
  l.keep = std::move(keep);
}

PipelineLinks::Link& PipelineLinks::find(const Key& key) {
  auto it = std::lower_bound(links_.begin(), links_.end(), key,
                             [](const Link& l, const Key& k) { return l.key < k; });
  if (it == links_.end() || it->key != key) {
    // A schedule's message on a link the chunks do not have: a bug here.
    throw std::logic_error(absl::StrCat("no pipeline link from rank ", key.from, " to rank ",
                                        key.to, " (kind ", static_cast<int>(key.kind), ")"));
  }
  return *it;
}

std::shared_ptr<gpu::Event> PipelineLinks::recv(MessageKind kind, int from, gpu::Stream& compute,
                                                const gpu::Tensor& into) {
  Link& l = find({kind, from, rank_});
  if (l.self) {
    std::shared_ptr<gpu::Event> done = compute.device().make_event();
    if (l.queued.empty()) {
      // A receive before its send: the order rule broken, a bug here.
      compute.fail(absl::InternalError(absl::StrCat("rank ", rank_, " receives its own ",
                                                    kind_name(kind), " before sending it")));
    } else {
      auto [what, sent] = std::move(l.queued.front());
      l.queued.pop_front();
      gpu::ops::copy(compute, into, what);
      compute.host_callback([&compute, sent = std::move(sent)] { sent(compute.status()); });
    }
    compute.record(*done);
    return done;
  }
  const char* name = kind == MessageKind::kActivation ? "receive activation" : "receive gradient";
  l.stream->device_call(
      name, {into}, [ch = l.channel, peer = l.peer, key = l.key, into, &compute](void* native) {
        absl::Status st = ch == nullptr ? not_connected(key)
                                        : ch->recv_on(native, into.raw(), into.nbytes(), peer);
        // The compute stream waits for this receive; what it would read is
        // not there.
        if (!st.ok()) {
          compute.fail(
              absl::Status(st.code(), absl::StrCat("receiving the ", kind_name(key.kind),
                                                   " from rank ", key.from, ": ", st.message())));
        }
        return st;
      });
  // An event of its own (not the link's, which the next receive records
  // again): the shard asks it whether this receive is done.
  std::shared_ptr<gpu::Event> done = l.stream->device().make_event();
  l.stream->record(*done);
  compute.wait(*done);
  return done;
}

void PipelineLinks::send(MessageKind kind, int to, gpu::Stream& compute, const gpu::Tensor& what,
                         std::function<void(absl::Status)> sent) {
  Link& l = find({kind, rank_, to});
  if (l.self) {
    l.queued.emplace_back(what, std::move(sent));
    return;
  }
  compute.record(*l.event);
  l.stream->wait(*l.event);
  const char* name = kind == MessageKind::kActivation ? "send activation" : "send gradient";
  l.stream->device_call(name, {what},
                        [ch = l.channel, peer = l.peer, key = l.key, what](void* native) {
                          if (ch == nullptr) return not_connected(key);
                          return ch->send_on(native, what.raw(), what.nbytes(), peer);
                        });
  l.stream->host_callback([s = l.stream.get(), sent = std::move(sent)] { sent(s->status()); });
}

void PipelineLinks::fail(const absl::Status& why) {
  for (Link& l : links_) {
    if (!l.self) l.stream->fail(why);
  }
}

void PipelineLinks::synchronize() {
  for (Link& l : links_) {
    if (!l.self) (void)l.stream->synchronize();
  }
}

}  // namespace troupe::actors
