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
        const std::string message = absl::StrCat(who(rank), ": ", what);
        finish(setup_->mark_rank_reports ? rank_report(rank, message)
                                         : absl::InternalError(message));
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
  if (step > setup_->options.steps) {
    // The run is over once its last checkpoint is committed.
    if (save_.step > 0 || pending_save_ > 0) {
      ending_ = true;
      return;
    }
    return finish(absl::OkStatus());
  }
  open(&now_, step, batches_.global_batch(step));
  // The order the actors start the step in: CAF's worker runs the actors
  // this one schedules newest first, and a second worker steals the
  // oldest. So the shards go in reverse rank order (ranks are
  // stage-major), and the first stage, whose forwards start the step,
  // begins at once. (In stage order, stage 0 began last: 27 us a stage
  // later at pp 8, on the step's critical path.) Each shard begins its
  // rank's optimizer partitions (ShardActor): between processes, one
  // control frame a rank, not two.
  const std::int64_t first = batches_.consumed_before(step);
  for (auto a = setup_->shards.rbegin(); a != setup_->shards.rend(); ++a) {
    send(*a, begin_step_atom::value, step, first, now_.loss_scale);
  }
}

// A step's (or an evaluation batch's) figures, as of now: the learning rate
// by steps or samples completed before it (--fp16: updated ones); no
// arrivals yet.
void Coordinator::open(Tally* t, int step, int global_batch) {
  const model::TrainOptions& o = setup_->options;
  *t = Tally{};
  t->step = step;
  t->lr = o.lr_of_step(batches_, step, scaler_->state());
  t->loss_scale = scaler_->scale();
  t->global_batch = global_batch;
  const auto world = static_cast<std::size_t>(setup_->layout.world());
  t->loss.assign(static_cast<std::size_t>(t->global_batch / o.micro_batch), 0.0);
  t->loss_seen.assign(t->loss.size(), false);
  t->norms.assign(world, 0.0);
  t->norm_seen.assign(world, false);
  t->ready.assign(world, false);
  t->t0 = std::chrono::steady_clock::now();
}

Coordinator::Tally* Coordinator::tally(int step) {
  if (finished_) return nullptr;
  if (step == now_.step) return &now_;
  if (next_.step != 0 && step == next_.step) return &next_;
  return nullptr;  // (a step that ended)
}

// A message from a worker is checked before it is counted: a duplicate or
// one outside the layout (a bug, or a rank in another process that went
// wrong) ends the run naming it instead of ending a step early or writing
// outside the tallies.
void Coordinator::on_loss(int step, int d, int j, double sum) {
  Tally* t = tally(step);
  if (t == nullptr) return;
  if (d < 0 || d >= setup_->shape.dp || j < 0 ||
      j >= t->global_batch / (setup_->options.micro_batch * setup_->shape.dp)) {
    return finish(absl::InternalError(absl::StrCat("step ", step, ": a loss for micro-batch ", j,
                                                   " of replica ", d, ", outside the layout")));
  }
  const std::size_t k = static_cast<std::size_t>(j * setup_->shape.dp + d);  // global order
  if (t->loss_seen[k]) {
    return finish(absl::InternalError(absl::StrCat("step ", step, ": micro-batch ", j,
                                                   " of replica ", d, " reported its loss twice")));
  }
  t->loss_seen[k] = true;
  t->loss[k] = sum;
  t->losses_in++;
}

void Coordinator::on_norm(int step, int rank, double sq) {
  Tally* t = tally(step);
  if (t == nullptr) return;
  if (rank < 0 || rank >= setup_->layout.world() || t->norm_seen[static_cast<std::size_t>(rank)]) {
    return finish(absl::InternalError(absl::StrCat("step ", step, ": a gradient norm from rank ",
                                                   rank, " (twice, or outside the layout)")));
  }
  t->norm_seen[static_cast<std::size_t>(rank)] = true;
  t->norms[static_cast<std::size_t>(rank)] = sq;
  if (++t->norms_in < setup_->layout.world()) return;
  if (t != &now_) {  // (a rank's ready comes before its next norm)
    return finish(absl::InternalError(absl::StrCat(
        "step ", step, ": every gradient norm came before step ", now_.step, " ended")));
  }
  double total = 0.0;
  for (double x : t->norms) total += x;  // in rank order
  // --fp16: not finite skips the step on every rank (update 0).
  const model::StepDecision d = scaler_->decide(total, setup_->options.clip_grad, t->global_batch);
  t->grad_norm = d.grad_norm;
  t->skipped = d.skip;
  const int update = d.skip ? 0 : step - scaler_->state().skipped_iters;
  // The next step with this update, when nothing comes between them; its
  // figures are the ones begin() would take after the last ready (the
  // scaler has decided this step).
  const bool early = begins_next(step);
  if (early) open(&next_, step + 1, batches_.global_batch(step + 1));
  const std::int64_t first = early ? batches_.consumed_before(step + 1) : 0;
  // Newest first on CAF's worker, as in begin(). The optimizer passes the
  // next begin_step to its shard: between processes, one control frame a
  // rank, not two.
  for (std::size_t r = setup_->optimizers.size(); r-- > 0;) {
    if (early) {
      send(setup_->optimizers[r], update_atom::value, step, now_.lr, d.grad_scale, update, first,
           next_.loss_scale);
    } else {
      send(setup_->optimizers[r], update_atom::value, step, now_.lr, d.grad_scale, update);
    }
  }
}

// Whether step `step + 1` may begin with step `step`'s update: nothing is
// due at the boundary. (A stop, exit signal or save asked for after this
// is taken at the next boundary, after step + 1.)
bool Coordinator::begins_next(int step) const {
  const model::TrainOptions& o = setup_->options;
  if (evaluating_ || ending_ || exiting_ || step >= o.steps || eval_due(step) ||
      !exit_due(step).empty() || save_now_) {
    return false;
  }
  return setup_->save_dir.empty() ||
         !model::ckpt::save_due(step, o.steps, setup_->save_interval, /*exiting=*/false);
}

bool Coordinator::eval_due(int step) const {
  const model::TrainOptions& o = setup_->options;
  return setup_->has_valid && o.eval_interval > 0 && step % o.eval_interval == 0;
}

// An exit asked for by a signal, or by --exit-interval or a host's stop
// before the last step.
std::string Coordinator::exit_due(int step) const {
  if (setup_->exit_requested && setup_->exit_requested()) return "exit signal";
  if (step >= setup_->options.steps) return "";
  if (setup_->exit_interval > 0 && step % setup_->exit_interval == 0) return "--exit-interval";
  return step >= stop_after_ ? "stop requested" : "";
}

void Coordinator::on_ready(int step, int rank) {
  Tally* t = tally(step);
  if (t == nullptr) return;
  if (t != &now_ || rank < 0 || rank >= static_cast<int>(t->ready.size()) ||
      t->ready[static_cast<std::size_t>(rank)]) {
    return finish(absl::InternalError(absl::StrCat(
        "step ", step, ": rank ", rank, " ready (twice, early, or outside the layout)")));
  }
  t->ready[static_cast<std::size_t>(rank)] = true;
  if (++t->ready_in < setup_->layout.world()) return;
  if (t->losses_in != static_cast<int>(t->loss.size())) {
    return finish(absl::InternalError(absl::StrCat("step ", step, ": ", t->losses_in, " of ",
                                                   t->loss.size(), " micro-batch losses arrived")));
  }
  const model::TrainOptions& o = setup_->options;
  const double tokens = static_cast<double>(t->global_batch) * o.model.T;
  if (evaluating_) {
    // As the single-rank loop: batches, then micro-batches.
    for (double l : t->loss) val_total_ += l;
    if (++eval_batch_ < o.eval_iters) return begin_eval_batch();
    evaluating_ = false;
    evaluations_done_++;
    metrics_.val_loss = val_total_ / (static_cast<double>(o.eval_iters) * tokens);
    return step_done();
  }
  double loss = 0.0;
  for (double l : t->loss) loss += l;
  // From its begin, or the step before's end if that came later (a step
  // begun with the one before's update): the steps' times add up to the
  // run's.
  const auto end = std::chrono::steady_clock::now();
  const double secs = std::chrono::duration<double>(end - std::max(t->t0, last_end_)).count();
  last_end_ = end;
  metrics_ = {.step = step,
              .global_batch = t->global_batch,
              .consumed_samples = batches_.consumed_before(step + 1),
              .loss = loss / tokens,
              .grad_norm = t->grad_norm,
              .loss_scale = t->loss_scale,
              .skipped = t->skipped,
              .skipped_steps = scaler_->state().skipped_iters,
              .lr = t->lr,
              .step_s = secs,
              .tokens_per_s = tokens / secs,
              .val_loss = std::nullopt};
  if (eval_due(step)) {
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
  const int step = now_.step;
  open(&now_, step, o.global_batch);
  const std::int64_t first =
      (static_cast<std::int64_t>(evaluations_done_) * o.eval_iters + eval_batch_) * o.global_batch;
  for (const caf::actor& a : setup_->shards) send(a, eval_atom::value, step, first);
}

void Coordinator::step_done() {
  if (setup_->on_step) setup_->on_step(metrics_);
  if (next_.step != 0) {  // begun with this step's update
    now_ = std::exchange(next_, Tally{});
    return;
  }
  const model::TrainOptions& o = setup_->options;
  const int step = now_.step;
  const std::string why = exit_due(step);
  exiting_ = !why.empty();
  if (exiting_) {
    say(absl::StrCat(why, ": ending after step ", step,
                     setup_->save_dir.empty() ? "" : " with a checkpoint"));
  }
  const bool save_now = std::exchange(save_now_, false);
  if (!setup_->save_dir.empty() &&
      (save_now || model::ckpt::save_due(step, o.steps, setup_->save_interval, exiting_))) {
    return request_save(step);
  }
  if (exiting_) return begin(o.steps + 1);
  begin(step + 1);
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
                      now_.step, writing, stall_report())));
}

// Who waits for what from whom, which shard never began the step, and the
// likely culprit (actors/diagnostics/stall_analysis.h).
std::string Coordinator::stall_report() const {
  return analyze_stall({.reports = reports_,
                        .layout = setup_->layout,
                        .step = now_.step,
                        .ready = now_.ready,
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
