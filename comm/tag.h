// The 64-bit tag every transport message carries, in one place.
//
// UCX's tag matching knows no sender, so the tag names it; a receive matches
// the full 64 bits. Layout, most significant bit first:
//
//   63  62      48 47   44 43   40 39        24 23      16 15   12 11         0
//   |ack| source  | group | kind  |   step     | micro-b. | chunk |   layer    |
//    1    15 bits   4 bits  4 bits   16 bits      8 bits    4 bits   12 bits
//
//   ack     reserved for the transport (acknowledgements of its own
//           single-copy protocol); always 0 in tags made here
//   source  global rank of the sender (up to 32,768 ranks)
//   group   GroupKind of the communicator (a rank is in one group per kind)
//   kind    MessageKind: what the payload is
//   step    training step (mod 2^16); for collectives, the communicator's
//           operation sequence number (mod 2^16), so back-to-back
//           collectives never match each other's messages
//   micro   micro-batch (pipeline messages)
//   chunk   model chunk / virtual stage (interleaved schedule)
//   layer   layer (gradient buckets)
// Pipeline messages (activations, gradients of the pipeline group) have no layer: their
// micro-batch takes its 12 bits as its high part, 20 bits in all
// (kMaxMicroBatches). Collectives reuse the low 24 bits (micro, chunk,
// layer) as one field: the algorithm's step (12 bits) and the slice within
// it (12 bits).
#pragma once

#include <cstdint>

namespace troupe::comm {

using Tag = std::uint64_t;

enum class GroupKind : std::uint8_t {
  kWorld = 0,
  kTensor = 1,
  kPipeline = 2,
  kData = 3,
  kEmbedding = 4,
  kChannel = 5,  // comm/stream_channel.h: in-order point-to-point (source, kind, sequence)
  kTest = 15
};
enum class MessageKind : std::uint8_t {
  kActivation = 0,  // forward, stage s -> s+1
  kGradient = 1,    // backward, stage s+1 -> s
  kGradSlice = 2,   // shard -> optimizer partition
  kParamSlice = 3,  // optimizer partition -> shard
  kCollective = 4,  // a step of a collective algorithm
  kControl = 5,
};

struct TagFields {
  std::uint32_t source = 0;  // 15 bits
  GroupKind group = GroupKind::kWorld;
  MessageKind kind = MessageKind::kControl;
  std::uint32_t step = 0;   // 16 bits
  std::uint32_t micro = 0;  // 8 bits
  std::uint32_t chunk = 0;  // 4 bits
  std::uint32_t layer = 0;  // 12 bits
};

// Micro-batches a pipeline message can name (per replica and step).
constexpr std::uint32_t kMaxMicroBatches = 1u << 20;

constexpr bool is_pipeline_message(GroupKind g, MessageKind k) {
  return g == GroupKind::kPipeline &&
         (k == MessageKind::kActivation || k == MessageKind::kGradient);
}

constexpr Tag make_tag(const TagFields& f) {
  // (A pipeline message's micro-batch: its low 8 bits in the micro field,
  // its high 12 in the layer field.)
  const std::uint32_t low = is_pipeline_message(f.group, f.kind) ? f.micro >> 8 : f.layer;
  return (static_cast<Tag>(f.source & 0x7FFF) << 48) |
         (static_cast<Tag>(static_cast<std::uint8_t>(f.group) & 0xF) << 44) |
         (static_cast<Tag>(static_cast<std::uint8_t>(f.kind) & 0xF) << 40) |
         (static_cast<Tag>(f.step & 0xFFFF) << 24) | (static_cast<Tag>(f.micro & 0xFF) << 16) |
         (static_cast<Tag>(f.chunk & 0xF) << 12) | static_cast<Tag>(low & 0xFFF);
}

constexpr TagFields parse_tag(Tag t) {
  const auto group = static_cast<GroupKind>((t >> 44) & 0xF);
  const auto kind = static_cast<MessageKind>((t >> 40) & 0xF);
  const auto micro = static_cast<std::uint32_t>((t >> 16) & 0xFF);
  const auto low = static_cast<std::uint32_t>(t & 0xFFF);
  const bool pipeline = is_pipeline_message(group, kind);
  return {static_cast<std::uint32_t>((t >> 48) & 0x7FFF),
          group,
          kind,
          static_cast<std::uint32_t>((t >> 24) & 0xFFFF),
          pipeline ? micro | (low << 8) : micro,
          static_cast<std::uint32_t>((t >> 12) & 0xF),
          pipeline ? 0 : low};
}

// A collective's message: sequence number `op`, algorithm step, slice.
constexpr Tag collective_tag(std::uint32_t source, GroupKind group, std::uint32_t op,
                             std::uint32_t algo_step, std::uint32_t slice) {
  return (static_cast<Tag>(source & 0x7FFF) << 48) |
         (static_cast<Tag>(static_cast<std::uint8_t>(group) & 0xF) << 44) |
         (static_cast<Tag>(static_cast<std::uint8_t>(MessageKind::kCollective)) << 40) |
         (static_cast<Tag>(op & 0xFFFF) << 24) | (static_cast<Tag>(algo_step & 0xFFF) << 12) |
         static_cast<Tag>(slice & 0xFFF);
}

// Bit 63: a transport's own acknowledgement of the message with the other 63 bits.
constexpr Tag kAckBit = Tag{1} << 63;

}  // namespace troupe::comm
