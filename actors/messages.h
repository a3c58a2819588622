// The messages between troupe's actors, in one place (CAF 0.17 atoms), and
// add_message_types(), which registers the library's message types with an
// actor system's config before the system starts, so another program can
// host these actors in its own actor system:
//
//   caf::actor_system_config cfg;
//   troupe::actors::add_message_types(cfg);
//   caf::actor_system sys{cfg};
//
// Signatures, by receiver (rank = global rank, d/j = replica/micro-batch):
//   ShardActor      (begin_step_atom, int step, int64 first_sample, float loss_scale)
//                       from the coordinator (loss_scale: --fp16's, else 1), or from
//                       the rank's optimizer during step - 1 (held until it is ready)
//                   (eval_atom, int step, int64 first_sample)   forwards only, validation data
//                   (waiting_atom) -> WaitReport
//   OptimizerActor  (begin_step_atom, int step, int64 first_sample, float loss_scale)
//                       from the rank's shard, as it begins the step: post gradient receives
//                   (update_atom, int step, float lr, float grad_scale, int update)
//                       update: Adam's 1-based count of updates; 0: skip the step
//                       (--fp16, gradients not finite), send the parameters unchanged
//                   (update_atom, int step, float lr, float grad_scale, int update,
//                    int64 next_first_sample, float next_loss_scale)
//                       the same, and step + 1 begins with it: begin_step to the shard
//                   (shard_atom, caf::actor shard)   once, before any step: the rank's
//                       shard (the next begin_step; with dp, dp_params_atom)
//                   (waiting_atom) -> WaitReport
//                   (save_atom, int step, std::string tmp_dir)   copy the state, write it behind
//   Coordinator     (loss_atom, int step, int d, int j, double loss_sum)   head chunk, per
//   micro-batch
//                   (norm_atom, int step, int rank, double squared_norm)   partitions of a rank
//                   (ready_atom, int step, int rank)      a shard has its new parameters
//                   (failed_atom, int rank, std::string what)
//                   (snapshot_atom, int step, int rank, std::string error)  state copied ("": ok)
//                   (saved_atom, int step, int rank, std::string records, std::string error)
//                       a rank's checkpoint file is written (records: JSON, model/checkpoint.h)
//                   (stop_atom, int step)   end after that step (or the one in progress, if later)
//                   (save_now_atom)         a checkpoint after the step in progress (with --save)
//                       (a step whose update began the next is no longer in progress)
// Internal (an actor to itself, from stream and transport callbacks):
//   (op_done_atom, int op_id), (recheck_atom, int step, int op), (bucket_atom, int step, int
//   chunk, int bucket),
//   (recv_atom, int what, int id, std::string error), (sent_atom, int what, int id, std::string
//   error), (reduced_atom, int step), (stepped_atom, int step), (added_atom, int step, int
//   partition, int contribution), (params_in_atom, int step)   a shard's new parameters are on its
//   device
// Between a rank's shard and optimizer, where the ZeRO-1 pieces go device to
// device (actors/optimizer_actor.h):
//   (dp_reduced_atom, int step)      the step's reduces are on the compute
//                                    stream, behind the rank's reduced event
//   (dp_params_atom, int step)       the optimizer's stream is past AdamW
//                                    and the broadcasts (and the params
//                                    event recorded behind them)
#pragma once

#include <bit>
#include <caf/all.hpp>
#include <cstdint>
#include <exception>
#include <string>

#include "absl/status/status.h"

namespace troupe::actors {

using begin_step_atom = caf::atom_constant<caf::atom("beginstep")>;
using eval_atom = caf::atom_constant<caf::atom("eval")>;
using update_atom = caf::atom_constant<caf::atom("update")>;
using loss_atom = caf::atom_constant<caf::atom("loss")>;
using norm_atom = caf::atom_constant<caf::atom("norm")>;
using ready_atom = caf::atom_constant<caf::atom("ready")>;
using failed_atom = caf::atom_constant<caf::atom("failed")>;
using waiting_atom = caf::atom_constant<caf::atom("waiting")>;
using start_atom = caf::atom_constant<caf::atom("start")>;
using op_done_atom = caf::atom_constant<caf::atom("opdone")>;
using bucket_atom = caf::atom_constant<caf::atom("bucket")>;
using recv_atom = caf::atom_constant<caf::atom("recvd")>;
using sent_atom = caf::atom_constant<caf::atom("sent")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using recheck_atom = caf::atom_constant<caf::atom("recheck")>;  // (int step, int op): zb-auto
using reduced_atom = caf::atom_constant<caf::atom("reduced")>;
using stepped_atom = caf::atom_constant<caf::atom("stepped")>;
using added_atom = caf::atom_constant<caf::atom("added")>;
using params_in_atom = caf::atom_constant<caf::atom("paramsin")>;
using shard_atom = caf::atom_constant<caf::atom("shard")>;
using dp_reduced_atom = caf::atom_constant<caf::atom("dpreduced")>;
using dp_params_atom = caf::atom_constant<caf::atom("dpparams")>;
using save_atom = caf::atom_constant<caf::atom("save")>;
using snapshot_atom = caf::atom_constant<caf::atom("snapshot")>;
using saved_atom = caf::atom_constant<caf::atom("saved")>;
using stop_atom = caf::atom_constant<caf::atom("trp_stop")>;  // (prefixed: public, troupe/troupe.h)
using save_now_atom = caf::atom_constant<caf::atom("trp_save")>;

// What an actor is waiting for (the launcher's hang diagnosis asks every
// actor): the schedule op it is at and the message it needs.
struct WaitReport {
  int rank = -1;
  std::string actor;    // "shard d=0 s=1", "optimizer d=1 s=0"
  int step = 0;         // 0: idle between runs
  int op_id = -1;       // schedule op id (-1: none)
  std::string op;       // "backward of micro-batch 3 (chunk 0)"
  std::string waiting;  // "gradient from rank 3", "" when not waiting
  int peer = -1;        // the rank that should send it (-1: none or local)
  double since_s = 0;   // how long it has waited
  // A shard whose stream has ops it has not finished: the oldest ("forward
  // of micro-batch 1 (chunk 0)"), else "". At a stall that op has not
  // finished for the whole timeout: the rank is where the waits end,
  // whatever its actor (which runs ahead of its stream) waits for next.
  std::string computing;
  // Work the actor has completed over the run (ops, arrivals, reductions):
  // the stall watchdog's progress between two of its questions.
  std::uint64_t progress = 0;
};

// since_s travels as its bits: CAF 0.17's binary float encoding loops for
// ever on an infinity and turns a NaN into a number (see FloatBits).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WaitReport& x) {
  std::uint64_t since = std::bit_cast<std::uint64_t>(x.since_s);
  auto load = caf::meta::load_callback([&]() -> caf::error {
    x.since_s = std::bit_cast<double>(since);
    return caf::none;
  });
  return f(caf::meta::type_name("troupe::WaitReport"), x.rank, x.actor, x.step, x.op_id, x.op,
           x.waiting, x.peer, since, x.progress, x.computing, load);
}

// A double or float of a message as it crosses a process boundary: its
// bits. CAF 0.17's binary serializer packs floating-point values with a
// loop that never ends for an infinity (a diverged loss) and does not keep
// NaN or subnormals; actors/runtime/remote.cc swaps these in for every double and
// float of a message on the way out, and back on the way in, so the
// receiver gets the sender's value bit for bit.
struct DoubleBits {
  std::uint64_t bits = 0;
};
struct FloatBits {
  std::uint32_t bits = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, DoubleBits& x) {
  return f(caf::meta::type_name("troupe::f64"), x.bits);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, FloatBits& x) {
  return f(caf::meta::type_name("troupe::f32"), x.bits);
}

std::string to_string(const WaitReport& r);

void add_message_types(caf::actor_system_config& cfg);

// What an exception an actor's handler threw says ("unknown exception" if
// it is not a std::exception).
std::string exception_text(const std::exception_ptr& e);

// Status to the text messages carry ("" for OK) and back.
inline std::string status_text(const absl::Status& st) {
  return st.ok() ? std::string() : st.ToString();
}

}  // namespace troupe::actors
