// UCX transport on the UCP tag API.
#include "comm/ucx_transport.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "comm/ucx_internal.h"

namespace troupe::comm {

namespace {

absl::Status ucs_error(ucs_status_t st, absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", ucs_status_string(st)));
}

// Whether peers of this host may read this process's memory with
// process_vm_readv. The kernel allows it to a process of the same user,
// unless Yama says otherwise: scope 1 needs our consent (PR_SET_PTRACER),
// 2 and 3 forbid it. Without Yama (no /proc/sys/kernel/yama) there is
// nothing to consent to: PR_SET_PTRACER then fails with EINVAL, which once
// turned the single-copy protocol off on hosts that allow it. A seccomp
// filter (some containers) may refuse the call itself: a read of our own
// memory tells. TROUPE_SINGLE_COPY=0 turns the protocol off.
bool single_copy_possible() {
  const char* env = std::getenv("TROUPE_SINGLE_COPY");
  if (env != nullptr && std::string(env) == "0") return false;
  std::ifstream yama("/proc/sys/kernel/yama/ptrace_scope");
  int scope = 0;
  if (yama >> scope) {
    if (scope >= 2) return false;
    if (scope == 1 && ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) != 0) return false;
  }
  char from = 1, to = 0;
  iovec local{&to, 1}, remote{&from, 1};
  return ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) == 1 && to == 1;
}

}  // namespace

// UCX completion callbacks (inside ucp_worker_progress or a post, on the
// worker's holder; finish() defers them while a caller posts its own).
void ucx_send_done(void* request, int status, void* user) {
  auto* op = static_cast<UcxTransport::Op*>(user);
  ucp_request_free(request);
  op->transport->finish(op, status == UCS_OK ? absl::OkStatus()
                                             : ucs_error(static_cast<ucs_status_t>(status),
                                                         absl::StrCat("send to rank ", op->peer)));
}

void ucx_recv_done(void* request, int status, const void* info_ptr, void* user) {
  auto* op = static_cast<UcxTransport::Op*>(user);
  const auto* info = static_cast<const ucp_tag_recv_info_t*>(info_ptr);
  ucp_request_free(request);
  absl::Status st;
  if (status != UCS_OK) {
    st = status == UCS_ERR_MESSAGE_TRUNCATED
             ? absl::InvalidArgumentError(absl::StrCat("message from rank ", op->peer,
                                                       " is longer than the receive of ", op->bytes,
                                                       " bytes"))
             : ucs_error(static_cast<ucs_status_t>(status),
                         absl::StrCat("receive from rank ", op->peer));
  } else if (info->length != op->bytes) {
    st = absl::InvalidArgumentError(absl::StrCat("message of ", info->length, " bytes from rank ",
                                                 op->peer, " for a receive of ", op->bytes,
                                                 " bytes"));
  }
  op->transport->finish(op, std::move(st));
}

namespace {
void send_cb(void* request, ucs_status_t status, void* user) {
  ucx_send_done(request, status, user);
}
void recv_cb(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
  ucx_recv_done(request, status, info, user);
}
}  // namespace

absl::StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::create(int rank, int size,
                                                                   UcxOptions options) {
  std::unique_ptr<UcxTransport> t(new UcxTransport(rank, size));
  const bool tls_given = std::getenv("UCX_TLS") != nullptr;
  t->one_host_ = options.one_host && !tls_given;
  t->one_host_because_ = options.because.empty() ? "comm::UcxOptions::one_host" : options.because;
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return ucs_error(st, "ucp_config_read");
  // Without UCX's peer-failure mode (which would turn shared memory off), a
  // CMA copy from a process that has just died is a fatal error inside UCX
  // (seen in tests/comm/ucx_test.cc: process_vm_readv fails, UCX aborts the
  // survivor). Shared-memory FIFOs and TCP fail softly, so CMA stays off
  // unless UCX_TLS says otherwise.
  // One host: no TCP either (UcxOptions::one_host).
  if (!tls_given) ucp_config_modify(config, "TLS", t->one_host_ ? "^cma,tcp" : "^cma");
  // With CMA off, UCX 1.13 runs the rendezvous of large messages between
  // processes of one host over TCP (ucx_perftest here: 4.2 GB/s, against
  // 10.9 GB/s eager over shared memory). Large messages on one host take our
  // single-copy protocol anyway; everything else goes eager. (Protocols v2,
  // UCX_PROTO_ENABLE=y, would also fix the speed but abort inside UCX when
  // a peer dies: seen in tests/comm/ucx_test.cc.)
  if (std::getenv("UCX_RNDV_THRESH") == nullptr) ucp_config_modify(config, "RNDV_THRESH", "inf");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  // WAKEUP: a thread with nothing to do can sleep until a message arrives
  // (wait_for_event) instead of polling.
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;
  ucp_context_h context = nullptr;
  st = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (st != UCS_OK) return ucs_error(st, "ucp_init");
  t->context_ = context;
  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // One thread at a time (worker_mu_): the progress thread or a caller driving.
  wparams.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  ucp_worker_h worker = nullptr;
  st = ucp_worker_create(context, &wparams, &worker);
  if (st != UCS_OK) return ucs_error(st, "ucp_worker_create");
  t->worker_ = worker;
  if (ucp_worker_get_efd(worker, &t->event_fd_) != UCS_OK) t->event_fd_ = -1;  // poll only
  t->wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ucp_address_t* addr = nullptr;
  std::size_t len = 0;
  st = ucp_worker_get_address(worker, &addr, &len);
  if (st != UCS_OK) return ucs_error(st, "ucp_worker_get_address");
  // Address: pid (u32), length (u16) of the place, the place, UCX address.
  // The place names the host and the pid namespace, and says whether this
  // process lets peers read its memory: two ranks use the single-copy
  // protocol between them only where their places are equal (pids mean the
  // same process, and both allow it).
  t->cma_allowed_ = single_copy_possible();
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  struct stat ns {};
  const bool have_ns = ::stat("/proc/self/ns/pid", &ns) == 0;
  const std::string place =
      absl::StrCat(host, " pidns=", have_ns ? ns.st_ino : 0, t->cma_allowed_ ? " cma" : " nocma");
  const auto pid = static_cast<std::uint32_t>(::getpid());
  const auto plen = static_cast<std::uint16_t>(place.size());
  t->address_.append(reinterpret_cast<const char*>(&pid), 4);
  t->address_.append(reinterpret_cast<const char*>(&plen), 2);
  t->address_.append(place);
  t->address_.append(reinterpret_cast<const char*>(addr), len);
  ucp_worker_release_address(worker, addr);

  t->failed_.resize(static_cast<std::size_t>(size));
  t->progress_ = std::thread([p = t.get()] { p->progress_loop(); });
  return t;
}

// (ucx_internal.h: the mark of a thread inside progress_once.)
thread_local bool ucx_internal::in_progress = false;
thread_local bool ucx_internal::posting_here = false;
std::vector<const void*>& ucx_internal::driving() {
  thread_local std::vector<const void*> v;
  return v;
}

// Every operation still pending completes (Aborted) before UCX goes (a
// regression: they were once dropped, their callbacks never run, and their
// owners waited for ever). The progress thread stops first, so that from
// then on this thread alone progresses UCX; the copy thread then finishes
// its reads (a descriptor arriving after that is refused, not read: see
// recv), this thread posts their acknowledgements, fails what is left,
// cancels UCX's requests and progresses until UCX has let go of their
// buffers (bounded).
UcxTransport::~UcxTransport() {
  {
    std::lock_guard<std::mutex> lock(mu_);  // no lost wake-up of a standing-down thread
    stop_ = true;
  }
  cv_.notify_all();
  if (progress_.joinable()) progress_.join();
  std::unique_ptr<CallbackQueue> copier;
  {
    std::lock_guard<std::mutex> lock(mu_);
    copier = std::move(copier_);
  }
  copier.reset();  // its reads finish; their acknowledgements are queued
  auto* worker = static_cast<ucp_worker_h>(worker_);
  if (worker != nullptr) {
    std::lock_guard<std::mutex> lock(worker_mu_);
    ucx_internal::InProgress mark;
    auto drive = [&](std::chrono::milliseconds bound, auto done) {
      const auto deadline = std::chrono::steady_clock::now() + bound;
      for (bool idle = false; !idle && !done() && std::chrono::steady_clock::now() < deadline;) {
        progress_once(&idle);
      }
    };
    drive(std::chrono::milliseconds(200), [&] {  // the acknowledgements go out
      std::lock_guard<std::mutex> l(mu_);
      return to_post_.empty();
    });
    const absl::Status why = absl::AbortedError(
        absl::StrCat("rank ", rank_, "'s UCX transport was shut down with the operation pending"));
    {
      std::lock_guard<std::mutex> l(mu_);
      closing_ = true;
    }
    fail_where([](const Op&) { return true; }, why, /*wait_for_ucx=*/false);
    drive(std::chrono::seconds(1), [] { return false; });
  }
  for (std::size_t r = 0; r < eps_.size(); r++) {
    void* ep = eps_[r];
    if (ep == nullptr) continue;
    // Force-close (no flush handshake): at teardown the peers are closing
    // too, and a flush to one that is already gone ends in UCX's "Endpoint
    // timeout" errors after a wait. (UCX documents forced close for its
    // peer-failure mode; without it, the peer may see an error on this
    // endpoint, which at teardown nobody reads.)
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* req = ucp_ep_close_nbx(static_cast<ucp_ep_h>(ep), &p);
    if (UCS_PTR_IS_PTR(req)) {
      for (int i = 0; i < 100000 && ucp_request_check_status(req) == UCS_INPROGRESS; i++) {
        ucp_worker_progress(worker);
      }
      ucp_request_free(req);
    }
  }
  if (worker != nullptr) ucp_worker_destroy(worker);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  if (context_ != nullptr) ucp_cleanup(static_cast<ucp_context_h>(context_));
}

absl::Status UcxTransport::connect(const std::vector<std::string>& addresses) {
  if (static_cast<int>(addresses.size()) != size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("connect: ", addresses.size(), " addresses for ", size_, " ranks"));
  }
  eps_.assign(static_cast<std::size_t>(size_), nullptr);
  same_host_.assign(static_cast<std::size_t>(size_), false);
  same_place_.assign(static_cast<std::size_t>(size_), false);
  std::uint16_t my_hlen = 0;
  std::memcpy(&my_hlen, address_.data() + 4, 2);
  const std::string my_host = address_.substr(6, my_hlen);
  // (A place is "HOST pidns=N cma|nocma".)
  const std::string here = my_host.substr(0, my_host.rfind(" pidns="));
  for (int r = 0; r < size_; r++) {
    const std::string& a = addresses[static_cast<std::size_t>(r)];
    std::uint16_t hlen = 0;
    if (a.size() >= 6) std::memcpy(&hlen, a.data() + 4, 2);
    if (a.size() < 6u + hlen)
      return absl::InvalidArgumentError(absl::StrCat("connect: bad address of rank ", r));
    const std::string place = a.substr(6, hlen);
    same_host_[static_cast<std::size_t>(r)] = cma_allowed_ && place == my_host;  // see create()
    // (Host and pid namespace, whatever either allows of its memory.)
    same_place_[static_cast<std::size_t>(r)] =
        place.substr(0, place.rfind(' ')) == my_host.substr(0, my_host.rfind(' '));
    const std::string host = place.substr(0, place.rfind(" pidns="));
    if (one_host_ && host != here) {
      return absl::FailedPreconditionError(absl::StrCat(
          "connect: rank ", r, " is on host ", host, ", not on ", here,
          ", where every rank was said to be (", one_host_because_,
          "), so UCX was set up without TCP; give UCX_TLS to choose its transports yourself"));
    }
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    p.address = reinterpret_cast<const ucp_address_t*>(a.data() + 6 + hlen);
    p.err_mode = UCP_ERR_HANDLING_MODE_NONE;  // keeps shared memory; liveness is out of band
    ucp_ep_h ep = nullptr;
    ucs_status_t st = ucp_ep_create(static_cast<ucp_worker_h>(worker_), &p, &ep);
    if (st != UCS_OK) return ucs_error(st, absl::StrCat("ucp_ep_create to rank ", r));
    eps_[static_cast<std::size_t>(r)] = ep;
  }
  return absl::OkStatus();
}

std::uint64_t UcxTransport::send_ucx(int peer, Tag tag, const void* data, std::size_t bytes,
                                     Callback done, std::shared_ptr<CancelToken> token, Kind kind,
                                     std::shared_ptr<void> keep) {
  auto op = std::make_unique<Op>(
      Op{this, peer, true, bytes, std::move(done), std::move(token), tag, const_cast<void*>(data)});
  op->kind = kind;
  op->keep = std::move(keep);
  return submit(std::move(op));
}

std::uint64_t UcxTransport::recv_ucx(int peer, Tag tag, void* data, std::size_t bytes,
                                     Callback done, std::shared_ptr<CancelToken> token,
                                     bool hold_on_cancel, std::shared_ptr<void> keep) {
  auto op = std::make_unique<Op>(
      Op{this, peer, false, bytes, std::move(done), std::move(token), tag, data});
  op->hold_on_cancel = hold_on_cancel;
  op->keep = std::move(keep);
  return submit(std::move(op));
}

void UcxTransport::abandon(std::uint64_t id, const absl::Status& why) {
  fail_where([id](const Op& op) { return op.id == id; }, why, /*wait_for_ucx=*/false);
}

// An exception escaping a completion callback would end the process on this
// thread; it becomes an error of every operation instead, so that whoever
// waits hears of it.
void UcxTransport::complete(Callback& done, absl::Status st) {
  std::string what;
  try {
    done(std::move(st));
    return;
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "an exception that is not a std::exception";
  }
  const absl::Status why =
      absl::InternalError(absl::StrCat("rank ", rank_, ": a completion callback threw: ", what));
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& f : failed_)
      if (f.ok()) f = why;
  }
  // Peers are alive: each operation reports once UCX has let go of its
  // buffer (or after the cancel bound), as a cancel does.
  fail_where([](const Op&) { return true; }, why, /*wait_for_ucx=*/true);
}

bool UcxTransport::consume_fault(Kind kind) {
  std::atomic<int>* left = kind == Kind::kCopyDescriptor ? &fault_desc_
                           : kind == Kind::kCopyAck      ? &fault_ack_
                                                         : nullptr;
  if (left == nullptr) return false;
  int n = left->load();
  while (n > 0 && !left->compare_exchange_weak(n, n - 1)) {
  }
  return n > 0;
}

void UcxTransport::inject_fault_for_test(Fault where, int count) {
  (where == Fault::kCopyDescriptorSend ? fault_desc_ : fault_ack_).store(count);
}

std::size_t UcxTransport::pending_operations() {
  std::lock_guard<std::mutex> lock(mu_);
  return ops_.size();
}

// Operations are queued, and posted to UCX by whoever holds worker_mu_, so
// the worker is used by one thread at a time and no completion can race a
// cancel: the calling thread itself where it can take the worker at once
// (a pipeline's send leaves without waking the progress thread first: that
// wake-up was on every hop's path), else the progress thread or a caller
// driving progress.
std::uint64_t UcxTransport::submit(std::unique_ptr<Op> owned) {
  Op* op = owned.get();
  std::uint64_t id = 0;
  bool here = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = op->id = next_id_++;
    ops_[op] = std::move(owned);
    absl::Status refuse;
    if (closing_) {
      refuse =
          absl::AbortedError(absl::StrCat("rank ", rank_, "'s UCX transport is shutting down"));
    } else if (op->peer < 0 || op->peer >= size_ || eps_.empty()) {
      refuse = absl::InvalidArgumentError(absl::StrCat(op->is_send ? "send to" : "receive from",
                                                       " rank ", op->peer, ": no such rank"));
    } else if (!failed_[static_cast<std::size_t>(op->peer)].ok()) {
      refuse = failed_[static_cast<std::size_t>(op->peer)];
    } else if (op->token && op->token->cancelled) {
      refuse = absl::CancelledError("operation posted after its communicator was aborted");
    }
    if (!refuse.ok()) {
      op->finished = true;
      op->done = [d = std::move(op->done), refuse](absl::Status) { d(refuse); };
      to_fail_.push_back(op);
    } else {
      to_post_.push_back(op);
    }
    // (Not from inside a callback, which holds the worker already, nor
    // while callers drive progress: they post it at their next poll.)
    here = refuse.ok() && drivers_ == 0 && !ucx_internal::in_progress;
    // The progress thread needs waking only when no caller drives progress (a
    // wake-up per operation of a driven collective cost ~5 us each in context
    // switches on the driver's core); a driver only if it sleeps, and not
    // for what it submits itself (it posts that at its next poll).
    if (!here && !ucx_internal::drives(this)) wake_locked();
  }
  if (here) post_here();
  return id;
}

void UcxTransport::post_here() {
  {
    std::unique_lock<std::mutex> worker(worker_mu_, std::try_to_lock);
    if (worker.owns_lock()) {
      std::vector<Op*> queued;
      {
        std::lock_guard<std::mutex> lock(mu_);
        queued.swap(to_post_);
      }
      ucx_internal::PostingHere mark;
      post_queued(queued);
    }
  }
  // Its completion (and anything else) is the progress thread's to run.
  std::lock_guard<std::mutex> lock(mu_);
  wake_locked();
}

void UcxTransport::complete_or_defer(std::unique_ptr<Op> op, absl::Status st) {
  if (ucx_internal::posting_here) {
    std::lock_guard<std::mutex> lock(mu_);
    to_complete_.emplace_back(std::move(op), std::move(st));
    return;
  }
  complete(op->done, std::move(st));
}

// Hands queued operations to UCX (the worker's holder: the progress thread,
// a driver, or a caller posting its own).
void UcxTransport::post_queued(std::vector<Op*>& queued) {
  auto* worker = static_cast<ucp_worker_h>(worker_);
  for (Op* op : queued) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (ops_.count(op) == 0 || op->finished) continue;  // failed while queued: runs from to_fail_
      op->in_ucx = true;
      op->posting = true;
    }
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.datatype = ucp_dt_make_contig(1);
    p.user_data = op;
    void* req;
    if (consume_fault(op->kind)) {
      req = UCS_STATUS_PTR(UCS_ERR_IO_ERROR);  // as if UCX had refused it (tests)
    } else if (op->is_send) {
      p.cb.send = send_cb;
      req = ucp_tag_send_nbx(static_cast<ucp_ep_h>(eps_[static_cast<std::size_t>(op->peer)]),
                             op->data, op->bytes, op->tag, &p);
    } else {
      p.cb.recv = recv_cb;
      req = ucp_tag_recv_nbx(worker, op->data, op->bytes, op->tag, ~ucp_tag_t{0}, &p);
    }
    std::unique_ptr<Op> completed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      op->posting = false;
      if (op->completed_in_post) {
        // UCX completed it inside the post call (it may, even with
        // NO_IMM_CMPL): finish() left it to us (a regression: it once
        // deleted the op under our feet).
        if (!op->finished) {
          auto it = ops_.find(op);
          completed = std::move(it->second);
          ops_.erase(it);
        }  // else: failed meanwhile; to_fail_ reports it
      } else if (UCS_PTR_IS_ERR(req)) {
        op->in_ucx = false;
        if (!op->finished) {
          op->finished = true;
          absl::Status err =
              ucs_error(UCS_PTR_STATUS(req), op->is_send ? "ucp_tag_send_nbx" : "ucp_tag_recv_nbx");
          op->done = [d = std::move(op->done), err](absl::Status) { d(err); };
          to_fail_.push_back(op);
        }
      } else if (op->in_ucx) {
        op->request = req;  // for ucp_request_cancel
      }
    }
    if (completed) {
      absl::Status st = std::move(completed->post_status);
      complete_or_defer(std::move(completed), std::move(st));
    }
  }
}

// Called on the progress thread by UCX's completion callbacks.
void UcxTransport::finish(Op* op, absl::Status st) {  // inside UCX's progress or a post
  std::unique_ptr<Op> owned;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = ops_.find(op);
    if (it == ops_.end()) return;
    op->in_ucx = false;
    op->request = nullptr;
    if (op->posting) {  // inside post_queued's ucp_tag_*_nbx: it finishes the job
      op->completed_in_post = true;
      op->post_status = std::move(st);
      return;
    }
    if (op->finished) {
      // Failed earlier by fail_peer/cancel. If its callback was deferred
      // until UCX let go of the buffer, that is now: report the failure.
      // It may wait in deferred_: out of there too before the Op is freed (a
      // regression: a new Op at the same address was taken for it and given
      // up on, its callback moved out and later called empty).
      std::erase(deferred_, op);
      if (op->callback_taken) {
        ops_.erase(it);
        return;
      }
      if (!op->wait_for_ucx || !op->cancel_sent) return;  // still in to_fail_: reported from there
    }
    owned = std::move(it->second);
    ops_.erase(it);
  }
  // (A failed op's callback ignores `st`: it reports the failure.)
  complete_or_defer(std::move(owned), std::move(st));
}

// Marks the selected operations failed; the progress thread runs their
// callbacks and cancels their UCX requests (there, so that no completion can
// free a request while it is being cancelled).
template <typename Pred>
void UcxTransport::fail_where(Pred pred, const absl::Status& why, bool wait_for_ucx) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [op, owned] : ops_) {
      if (!pred(*op)) continue;
      if (!wait_for_ucx) op->peer_dead = true;  // a held operation gives up at once
      if (op->finished) continue;
      op->finished = true;
      op->wait_for_ucx = wait_for_ucx;
      op->done = [d = std::move(op->done), why](absl::Status) { d(why); };
      to_fail_.push_back(op);
    }
    wake_locked();
  }
}

void UcxTransport::fail_peer(int peer, absl::Status why) {
  if (peer < 0 || peer >= size_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed_[static_cast<std::size_t>(peer)] = why;
  }
  // A dead peer moves no more data: report at once.
  fail_where([peer](const Op& op) { return op.peer == peer; }, why, /*wait_for_ucx=*/false);
}

void UcxTransport::cancel(const std::shared_ptr<CancelToken>& token, absl::Status why) {
  if (!token) return;
  token->cancelled = true;
  // Live peers may still be moving data in or out of these buffers: report
  // when UCX has let go of them (the cancel completes them), or after 1 s.
  fail_where([&token](const Op& op) { return op.token == token; }, why, /*wait_for_ucx=*/true);
}

}  // namespace troupe::comm
