// Coordinator: begin_step, losses, global norm, update, ready.
#include "actors/coordinator.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "actors/diagnostics/stall_analysis.h"
#include "actors/messages.h"
#include "model/optimizer.h"

namespace troupe::actors {

void set_checkpoints(CoordinatorSetup* setup, const RunCheckpoints& c,
                     const ParallelOptions& parallel) {
  if (c.loaded != nullptr && c.flags.load_optim) {
    setup->first_step = c.loaded->meta().step + 1;
    setup->evaluations_done = c.loaded->meta().evaluations_done;
    setup->loss_scale = c.loaded->meta().loss_scale;  // (none: a fresh scaler)
  }
  setup->save_dir = c.flags.save;
  setup->save_interval = c.flags.save_interval;
  setup->keep_last = c.flags.keep_last;
  setup->exit_requested = c.exit_requested;
  setup->exit_interval = c.flags.exit_interval;
  setup->log = c.log;
  setup->on_checkpoint = c.on_checkpoint;
  model::ckpt::Meta& m = setup->meta;
  m.options = setup->options;
  m.tp = parallel.tp;
  m.pp = parallel.pp;
  m.dp = parallel.dp;
  m.virtual_stages = parallel.virtual_stages;
  m.schedule = schedule_name(parallel.schedule);
  m.writer = model::ckpt::writer_name();
}

Coordinator::Coordinator(caf::actor_config& cfg, std::shared_ptr<CoordinatorSetup> setup)
    : caf::event_based_actor(cfg), setup_(std::move(setup)), batches_(setup_->options.batches()) {
  scaler_ = std::make_unique<model::LossScaler>(setup_->options.activations.precision,
                                                setup_->options.loss_scale);
  if (setup_->loss_scale) scaler_->restore(*setup_->loss_scale);  // a resume
  set_exception_handler([this](caf::scheduled_actor*, std::exception_ptr& e) -> caf::error {
    const std::string what = exception_text(e);
    finish(absl::InternalError(absl::StrCat("the coordinator threw: ", what)));
    return caf::make_error(caf::sec::runtime_error, what);
  });
  set_down_handler([this](caf::down_msg& dm) {
    for (std::size_t r = 0; r < setup_->shards.size(); r++) {
      if (dm.source == setup_->shards[r] || dm.source == setup_->optimizers[r]) {
        return finish(absl::InternalError(
            absl::StrCat(who(static_cast<int>(r)), " stopped: ", home_system().render(dm.reason))));
      }
    }
  });
}

caf::behavior Coordinator::make_behavior() {
  return {
      [this](start_atom) {
        for (const caf::actor& a : setup_->shards) monitor(a);
        for (const caf::actor& a : setup_->optimizers) monitor(a);
        if (setup_->stall_timeout_s > 0) watch(progress_);
        evaluations_done_ = setup_->evaluations_done;
        begin(setup_->first_step);
      },
      [this](loss_atom, int step, int d, int j, double sum) {
        progress();
        on_loss(step, d, j, sum);
      },
      [this](norm_atom, int step, int rank, double sq) {
        progress();
        on_norm(step, rank, sq);
      },
      [this](ready_atom, int step, int rank) {
        progress();
        on_ready(step, rank);
      },
      [this](tick_atom, std::uint64_t seen) {
        if (finished_ || reports_due_ > 0) return;
        poll_workers(seen);
      },
      [this](snapshot_atom, int step, int rank, const std::string& error) {
        progress();
        on_snapshot(step, rank, error);
      },
      [this](saved_atom, int step, int rank, const std::string& records, const std::string& error) {
        progress();
        on_saved(step, rank, records, error);
      },
      [this](failed_atom, int rank, const std::string& what) {
        finish(absl::InternalError(absl::StrCat(who(rank), ": ", what)));
      },
      [this](stop_atom, int step) { stop_after_ = std::min(stop_after_, step); },
      [this](save_now_atom) { save_now_ = true; },
  };
}

std::string Coordinator::who(int rank) const {
  const comm::Coord c = setup_->layout.coord(rank);
  return absl::StrCat("rank ", rank, " (d=", c.d, " s=", c.s,
                      setup_->layout.tp > 1 ? absl::StrCat(" t=", c.t) : "", ")");
}

void Coordinator::begin(int step) {
  if (finished_) return;
  const model::TrainOptions& o = setup_->options;
  if (step > o.steps) {
    // The run is over once its last checkpoint is committed.
    if (save_.step > 0 || pending_save_ > 0) {
      ending_ = true;
      return;
    }
    return finish(absl::OkStatus());
  }
  step_ = step;
  // By steps or samples completed before this one (--fp16: updated ones).
  lr_ = o.lr_of_step(batches_, step, scaler_->state());
  loss_scale_ = scaler_->scale();
  global_batch_ = batches_.global_batch(step);
  reset_tallies();
  t0_ = std::chrono::steady_clock::now();
  const std::int64_t first = batches_.consumed_before(step);
  // The order the actors start the step in: CAF's worker runs the actors
  // this one schedules newest first, and a second worker steals the
  // oldest. So the shards go in reverse rank order (ranks are
  // stage-major), and the first stage, whose forwards start the step,
  // begins at once. (In stage order, stage 0 began last: 27 us a stage
  // later at pp 8, on the step's critical path.) Each shard begins its
  // rank's optimizer partitions (ShardActor): between processes, one
  // control frame a rank, not two.
  for (auto a = setup_->shards.rbegin(); a != setup_->shards.rend(); ++a) {
    send(*a, begin_step_atom::value, step, first, loss_scale_);
  }
}

// The tallies of a step or an evaluation batch of global_batch_ sequences.
void Coordinator::reset_tallies() {
  loss_.assign(static_cast<std::size_t>(global_batch_ / setup_->options.micro_batch), 0.0);
  norms_.assign(static_cast<std::size_t>(setup_->layout.world()), 0.0);
  losses_in_ = norms_in_ = ready_in_ = 0;
  ready_.assign(static_cast<std::size_t>(setup_->layout.world()), false);
  loss_seen_.assign(loss_.size(), false);
  norm_seen_.assign(norms_.size(), false);
}

// A message from a worker is checked before it is counted: a duplicate or
// one outside the layout (a bug, or a rank in another process that went
// wrong) ends the run naming it instead of ending a step early or writing
// outside the tallies.
void Coordinator::on_loss(int step, int d, int j, double sum) {
  if (step != step_ || finished_) return;
  if (d < 0 || d >= setup_->shape.dp || j < 0 ||
      j >= global_batch_ / (setup_->options.micro_batch * setup_->shape.dp)) {
    return finish(absl::InternalError(absl::StrCat("step ", step, ": a loss for micro-batch ", j,
                                                   " of replica ", d, ", outside the layout")));
  }
  const std::size_t k = static_cast<std::size_t>(j * setup_->shape.dp + d);  // global order
  if (loss_seen_[k]) {
    return finish(absl::InternalError(absl::StrCat("step ", step, ": micro-batch ", j,
                                                   " of replica ", d, " reported its loss twice")));
  }
  loss_seen_[k] = true;
  loss_[k] = sum;
  losses_in_++;
}

void Coordinator::on_norm(int step, int rank, double sq) {
  if (step != step_ || finished_) return;
  if (rank < 0 || rank >= setup_->layout.world() || norm_seen_[static_cast<std::size_t>(rank)]) {
    return finish(absl::InternalError(absl::StrCat("step ", step, ": a gradient norm from rank ",
                                                   rank, " (twice, or outside the layout)")));
  }
  norm_seen_[static_cast<std::size_t>(rank)] = true;
  norms_[static_cast<std::size_t>(rank)] = sq;
  if (++norms_in_ < setup_->layout.world()) return;
  double total = 0.0;
  for (double x : norms_) total += x;  // in rank order
  // --fp16: not finite skips the step on every rank (update 0).
  const model::StepDecision d = scaler_->decide(total, setup_->options.clip_grad, global_batch_);
  grad_norm_ = d.grad_norm;
  skipped_ = d.skip;
  const int update = d.skip ? 0 : step - scaler_->state().skipped_iters;
  for (const caf::actor& a : setup_->optimizers) {
    send(a, update_atom::value, step, lr_, d.grad_scale, update);
  }
}

void Coordinator::on_ready(int step, int rank) {
  if (step != step_ || finished_) return;
  if (rank < 0 || rank >= static_cast<int>(ready_.size()) ||
      ready_[static_cast<std::size_t>(rank)]) {
    return finish(absl::InternalError(
        absl::StrCat("step ", step, ": rank ", rank, " ready (twice, or outside the layout)")));
  }
  ready_[static_cast<std::size_t>(rank)] = true;
  if (++ready_in_ < setup_->layout.world()) return;
  if (losses_in_ != static_cast<int>(loss_.size())) {
    return finish(absl::InternalError(absl::StrCat("step ", step, ": ", losses_in_, " of ",
                                                   loss_.size(), " micro-batch losses arrived")));
  }
  const model::TrainOptions& o = setup_->options;
  const double tokens = static_cast<double>(global_batch_) * o.model.T;
  if (evaluating_) {
    for (double l : loss_) val_total_ += l;  // as the single-rank loop: batches, then micro-batches
    if (++eval_batch_ < o.eval_iters) return begin_eval_batch();
    evaluating_ = false;
    evaluations_done_++;
    metrics_.val_loss = val_total_ / (static_cast<double>(o.eval_iters) * tokens);
    return step_done();
  }
  double loss = 0.0;
  for (double l : loss_) loss += l;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  metrics_ = {.step = step,
              .global_batch = global_batch_,
              .consumed_samples = batches_.consumed_before(step + 1),
              .loss = loss / tokens,
              .grad_norm = grad_norm_,
              .loss_scale = loss_scale_,
              .skipped = skipped_,
              .skipped_steps = scaler_->state().skipped_iters,
              .lr = lr_,
              .step_s = secs,
              .tokens_per_s = tokens / secs,
              .val_loss = std::nullopt};
  if (setup_->has_valid && o.eval_interval > 0 && step % o.eval_interval == 0) {
    evaluating_ = true;
    eval_batch_ = 0;
    val_total_ = 0.0;
    return begin_eval_batch();
  }
  step_done();
}

// Evaluation e reads validation samples [e*K*GBS, (e+1)*K*GBS), K = --eval-iters.
void Coordinator::begin_eval_batch() {
  const model::TrainOptions& o = setup_->options;
  global_batch_ = o.global_batch;
  reset_tallies();
  const std::int64_t first =
      (static_cast<std::int64_t>(evaluations_done_) * o.eval_iters + eval_batch_) * o.global_batch;
  for (const caf::actor& a : setup_->shards) send(a, eval_atom::value, step_, first);
}

void Coordinator::step_done() {
  if (setup_->on_step) setup_->on_step(metrics_);
  const model::TrainOptions& o = setup_->options;
  const bool signal = setup_->exit_requested && setup_->exit_requested();
  const bool interval =
      setup_->exit_interval > 0 && step_ % setup_->exit_interval == 0 && step_ < o.steps;
  const bool stop = step_ >= stop_after_ && step_ < o.steps;
  exiting_ = signal || interval || stop;
  if (exiting_) {
    say(absl::StrCat(signal     ? "exit signal"
                     : interval ? "--exit-interval"
                                : "stop requested",
                     ": ending after step ", step_,
                     setup_->save_dir.empty() ? "" : " with a checkpoint"));
  }
  const bool save_now = std::exchange(save_now_, false);
  if (!setup_->save_dir.empty() &&
      (save_now || model::ckpt::save_due(step_, o.steps, setup_->save_interval, exiting_))) {
    return request_save(step_);
  }
  if (exiting_) return begin(o.steps + 1);
  begin(step_ + 1);
}

// A save waits for the one before it: training stops at this step
// boundary until that one is committed.
void Coordinator::request_save(int step) {
  if (save_.step > 0) {
    pending_save_ = step;
    return;
  }
  start_save(step);
}

void Coordinator::start_save(int step) {
  absl::StatusOr<std::string> tmp = model::ckpt::begin_save(setup_->save_dir, step);
  if (!tmp.ok()) return finish(tmp.status());
  save_ = {};
  save_.step = step;
  save_.loss_scale = scaler_->state();
  save_.evaluations_done = evaluations_done_;  // (more may be done by the commit)
  save_.tmp = *tmp;
  save_.records.resize(static_cast<std::size_t>(setup_->layout.world()));
  save_.snapshotted.assign(save_.records.size(), false);
  save_.wrote.assign(save_.records.size(), false);
  save_.t0 = std::chrono::steady_clock::now();
  for (const caf::actor& a : setup_->optimizers) send(a, save_atom::value, step, save_.tmp);
}

void Coordinator::on_snapshot(int step, int rank, const std::string& error) {
  if (finished_ || step != save_.step) return;
  if (rank < 0 || rank >= setup_->layout.world() ||
      save_.snapshotted[static_cast<std::size_t>(rank)]) {
    return finish(absl::InternalError(absl::StrCat("checkpoint ", step, ": a snapshot from rank ",
                                                   rank, " (twice, or outside the layout)")));
  }
  if (!error.empty()) {
    return finish(absl::InternalError(absl::StrCat(who(rank), ": checkpoint ", step, ": ", error)));
  }
  save_.snapshotted[static_cast<std::size_t>(rank)] = true;
  if (++save_.snapshots < setup_->layout.world()) return;
  // Every rank's state is copied: training goes on while the files are
  // written (or ends, after the last step, once they are committed).
  save_.stall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - save_.t0).count();
  const bool last = exiting_ || step >= setup_->options.steps;
  if (last) ending_ = true;
  // (A rank's `saved` comes from its writer thread, not after its
  // `snapshot`: every file may be in before the last copy is reported.)
  if (save_.written == setup_->layout.world()) {
    if (!commit_save()) return;
    if (last && save_.step == 0) return finish(absl::OkStatus());
  }
  if (!last) begin(step + 1);
}

void Coordinator::on_saved(int step, int rank, const std::string& records,
                           const std::string& error) {
  if (finished_ || step != save_.step) return;
  if (rank < 0 || rank >= setup_->layout.world() || save_.wrote[static_cast<std::size_t>(rank)]) {
    return finish(absl::InternalError(absl::StrCat("checkpoint ", step, ": a file from rank ", rank,
                                                   " (twice, or outside the layout)")));
  }
  if (!error.empty()) {
    return finish(
        absl::InternalError(absl::StrCat(who(rank), ": writing checkpoint ", step, ": ", error)));
  }
  absl::StatusOr<std::vector<model::ckpt::TensorRecord>> r =
      model::ckpt::records_from_text(records);
  if (!r.ok())
    return finish(absl::InternalError(absl::StrCat(who(rank), ": ", r.status().message())));
  save_.records[static_cast<std::size_t>(rank)] = std::move(*r);
  save_.wrote[static_cast<std::size_t>(rank)] = true;
  if (++save_.written < setup_->layout.world()) return;
  if (save_.snapshots < setup_->layout.world()) return;  // on_snapshot commits
  if (!commit_save()) return;
  if (ending_ && save_.step == 0) finish(absl::OkStatus());
}

// Every rank has fsynced its file and reported its copy: the commit
// (manifest, rename, tracker), then the save that waited for this one.
// False when the run has ended (the commit failed).
bool Coordinator::commit_save() {
  std::vector<model::ckpt::TensorRecord> all;
  for (auto& rr : save_.records) all.insert(all.end(), rr.begin(), rr.end());
  const int step = save_.step;
  model::ckpt::Meta meta = setup_->meta;
  meta.step = step;
  meta.consumed_samples = batches_.consumed_before(step + 1);
  meta.evaluations_done = save_.evaluations_done;
  meta.loss_scale = save_.loss_scale;
  if (absl::Status st =
          model::ckpt::commit(setup_->save_dir, save_.tmp, meta, all, setup_->keep_last);
      !st.ok()) {
    finish(st);
    return false;
  }
  const double total =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - save_.t0).count();
  say(absl::StrFormat("saved checkpoint %s/%s (training waited %.3f s; written in %.2f s)",
                      setup_->save_dir, model::ckpt::iter_name(step), save_.stall_s, total));
  if (setup_->on_checkpoint) {
    setup_->on_checkpoint(step, absl::StrCat(setup_->save_dir, "/", model::ckpt::iter_name(step)));
  }
  save_ = {};
  if (pending_save_ > 0) {
    const int next = pending_save_;
    pending_save_ = 0;
    start_save(next);
  }
  return !finished_;
}

void Coordinator::watch(std::uint64_t seen) {
  delayed_send(this,
               std::chrono::duration_cast<caf::timespan>(
                   std::chrono::duration<double>(setup_->stall_timeout_s)),
               tick_atom::value, seen);
}

// Every tick: every worker says what it waits for (op, micro-batch, from
// whom, since when) and how much work it has completed. A compute phase
// can send the coordinator nothing for longer than the timeout (a long
// backward, an evaluation); its completed ops are progress too.
void Coordinator::poll_workers(std::uint64_t seen) {
  std::vector<caf::actor> workers = setup_->shards;
  workers.insert(workers.end(), setup_->optimizers.begin(), setup_->optimizers.end());
  reports_.clear();
  reports_due_ = static_cast<int>(workers.size());
  auto answered = [this, seen] {
    if (--reports_due_ == 0) judge_progress(seen);
  };
  for (const caf::actor& w : workers) {
    request(w, std::chrono::seconds(10), waiting_atom::value)
        .then(
            [this, answered](const WaitReport& r) {
              reports_.push_back(r);
              answered();
            },
            [answered](caf::error&) { answered(); });
  }
}

void Coordinator::judge_progress(std::uint64_t seen) {
  if (finished_) return;
  std::uint64_t work = 0;
  for (const WaitReport& r : reports_) work += r.progress;
  const bool moved = progress_ != seen || work != worker_progress_;
  worker_progress_ = work;
  if (moved) return watch(progress_);
  // (A rank's file that takes longer than the timeout to write is a hang
  // too: a stuck file system must not hold the job for ever.)
  std::string writing;
  if (save_.step > 0) {
    std::vector<std::string> missing;
    for (std::size_t r = 0; r < save_.wrote.size(); r++) {
      if (!save_.wrote[r]) missing.push_back(std::to_string(r));
    }
    writing = absl::StrCat("; checkpoint ", save_.step, ": ", save_.written, " of ",
                           setup_->layout.world(), " ranks have written their files (not ranks ",
                           absl::StrJoin(missing, ", "), ")");
  }
  finish(absl::DeadlineExceededError(
      absl::StrFormat("no progress for %.1f s in step %d%s; waiting:%s", setup_->stall_timeout_s,
                      step_, writing, stall_report())));
}

// Who waits for what from whom, which shard never began the step, and the
// likely culprit (actors/diagnostics/stall_analysis.h).
std::string Coordinator::stall_report() const {
  return analyze_stall({.reports = reports_,
                        .layout = setup_->layout,
                        .step = step_,
                        .ready = ready_,
                        .hosts = setup_->hosts})
      .text();
}

void Coordinator::on_exit() {
  if (!finished_) {
    finished_ = true;
    if (setup_->on_finish) setup_->on_finish(absl::InternalError("the coordinator stopped"));
  }
  setup_->shards.clear();
  setup_->optimizers.clear();
  setup_->on_step = nullptr;
  setup_->log = nullptr;  // (what a host's callbacks hold goes with the run)
  setup_->on_checkpoint = nullptr;
}

void Coordinator::finish(absl::Status st) {
  if (finished_) return;
  finished_ = true;
  if (setup_->on_finish) setup_->on_finish(std::move(st));
  quit();
}

}  // namespace troupe::actors
