// Job positions from the environment of srun, mpirun and torchrun; see
// launcher/world_env.h.
#include "launcher/world_env.h"

#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace troupe::launcher {
namespace {

// An integer variable: nullopt if unset, an error naming it if not a number.
absl::StatusOr<std::optional<int>> int_var(const GetEnv& getenv, const char* name) {
  const char* v = getenv(name);
  if (v == nullptr) return std::optional<int>();
  int n = 0;
  if (!absl::SimpleAtoi(v, &n) || n < 0)
    return absl::InvalidArgumentError(absl::StrCat(name, "=", v, ": not a non-negative integer"));
  return std::optional<int>(n);
}

// The (rank, world, local rank) variables of one engine, if its rank and
// world are set; the local rank defaults to 0.
absl::StatusOr<std::optional<WorldPosition>> from(const GetEnv& getenv, const char* rank,
                                                  const char* world, const char* local,
                                                  const char* engine) {
  auto r = int_var(getenv, rank);
  if (!r.ok()) return r.status();
  auto w = int_var(getenv, world);
  if (!w.ok()) return w.status();
  if (!*r && !*w) return std::optional<WorldPosition>();
  if (!*r || !*w) {
    return absl::InvalidArgumentError(absl::StrCat(engine, ": ", *r ? world : rank,
                                                   " is not set but ", *r ? rank : world, " is"));
  }
  auto l = int_var(getenv, local);
  if (!l.ok()) return l.status();
  if (**w < 1 || **r >= **w) {
    return absl::InvalidArgumentError(
        absl::StrCat(engine, ": ", rank, "=", **r, " is not a rank of ", world, "=", **w));
  }
  WorldPosition p;
  p.rank = **r;
  p.world = **w;
  p.local_rank = l->value_or(0);
  p.engine = engine;
  return std::optional<WorldPosition>(p);
}

// Expands one host expression (no top-level commas): each [..] group
// multiplies the hosts so far by its members.
absl::Status expand_one(absl::string_view expr, std::size_t max, std::vector<std::string>* out) {
  std::vector<std::string> hosts = {""};
  while (!expr.empty()) {
    const std::size_t open = expr.find('[');
    const absl::string_view literal = expr.substr(0, open);
    if (literal.find(']') != absl::string_view::npos)
      return absl::InvalidArgumentError("a ']' without its '['");
    for (auto& h : hosts) h.append(literal.data(), literal.size());
    if (open == absl::string_view::npos) break;
    const std::size_t close = expr.find(']', open);
    if (close == absl::string_view::npos)
      return absl::InvalidArgumentError("a '[' without its ']'");
    std::vector<std::string> members;
    for (absl::string_view range : absl::StrSplit(expr.substr(open + 1, close - open - 1), ',')) {
      std::vector<absl::string_view> ends = absl::StrSplit(range, absl::MaxSplits('-', 1));
      std::uint64_t lo = 0, hi = 0;
      if (ends[0].empty() || !absl::SimpleAtoi(ends[0], &lo) ||
          (ends.size() == 2 && (ends[1].empty() || !absl::SimpleAtoi(ends[1], &hi))))
        return absl::InvalidArgumentError(absl::StrCat("bad range '", range, "'"));
      if (ends.size() == 1) hi = lo;
      if (hi < lo) return absl::InvalidArgumentError(absl::StrCat("bad range '", range, "'"));
      if (hi - lo >= max) return absl::InvalidArgumentError("too many hosts");
      const std::size_t width = ends[0].size();  // "01-10": two digits
      for (std::uint64_t i = lo; i <= hi; i++) {
        std::string n = absl::StrCat(i);
        if (n.size() < width) n.insert(0, width - n.size(), '0');
        members.push_back(std::move(n));
        if (members.size() > max) return absl::InvalidArgumentError("too many hosts");
      }
    }
    if (hosts.size() * members.size() > max) return absl::InvalidArgumentError("too many hosts");
    std::vector<std::string> next;
    for (const auto& h : hosts)
      for (const auto& m : members) next.push_back(h + m);
    hosts = std::move(next);
    expr = expr.substr(close + 1);
  }
  if (out->size() + hosts.size() > max) return absl::InvalidArgumentError("too many hosts");
  for (auto& h : hosts) {
    if (h.empty()) return absl::InvalidArgumentError("an empty host name");
    out->push_back(std::move(h));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> expand_slurm_hostlist(absl::string_view list,
                                                               std::size_t max_hosts) {
  std::vector<std::string> hosts;
  std::size_t start = 0;
  int depth = 0;
  for (std::size_t i = 0; i <= list.size(); i++) {
    const char c = i < list.size() ? list[i] : ',';
    if (c == '[') depth++;
    if (c == ']') depth--;
    if (depth < 0 || depth > 1)
      return absl::InvalidArgumentError(
          absl::StrCat("host list '", list, "': unbalanced brackets"));
    if (c != ',' || depth != 0) continue;
    absl::Status st = expand_one(list.substr(start, i - start), max_hosts, &hosts);
    if (!st.ok())
      return absl::InvalidArgumentError(absl::StrCat("host list '", list, "': ", st.message()));
    start = i + 1;
  }
  if (depth != 0)
    return absl::InvalidArgumentError(absl::StrCat("host list '", list, "': unbalanced brackets"));
  return hosts;
}

namespace {

// This node's entry of a SLURM tasks-per-node list ("4(x2),3": four tasks
// on each of the first two nodes, three on the third); 0 where the list is
// malformed or shorter.
int tasks_on_node(absl::string_view list, int node) {
  for (absl::string_view entry : absl::StrSplit(list, ',')) {
    int tasks = 0, repeat = 1;
    const std::size_t paren = entry.find("(x");
    if (paren != absl::string_view::npos) {
      if (!absl::EndsWith(entry, ")") ||
          !absl::SimpleAtoi(entry.substr(paren + 2, entry.size() - paren - 3), &repeat) ||
          repeat <= 0) {
        return 0;
      }
      entry = entry.substr(0, paren);
    }
    if (!absl::SimpleAtoi(entry, &tasks) || tasks <= 0) return 0;
    if (node < repeat) return tasks;
    node -= repeat;
  }
  return 0;
}

}  // namespace

namespace {

// This node's tasks as SLURM says: its entry (by SLURM_NODEID) of the
// step's own list (an srun step inherits the job's SLURM_NTASKS_PER_NODE
// even where it runs fewer tasks a node), of the job's, or
// SLURM_NTASKS_PER_NODE; 0 where none says.
int slurm_tasks_here(const GetEnv& getenv) {
  int node = 0, n = 0;
  if (const char* id = getenv("SLURM_NODEID");
      id != nullptr && absl::SimpleAtoi(id, &node) && node >= 0) {
    for (const char* v : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
      if (const char* list = getenv(v); list != nullptr) {
        if (const int tasks = tasks_on_node(list, node); tasks > 0) return tasks;
      }
    }
  }
  const char* v = getenv("SLURM_NTASKS_PER_NODE");
  return v != nullptr && absl::SimpleAtoi(v, &n) && n > 0 ? n : 0;
}

}  // namespace

int local_world_from_env(const GetEnv& getenv) {
  int n = 0;
  for (const char* v : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"}) {
    if (const char* value = getenv(v); value != nullptr && absl::SimpleAtoi(value, &n) && n > 0) {
      return n;
    }
  }
  n = slurm_tasks_here(getenv);
  return n > 0 ? n : 1;
}

absl::StatusOr<std::optional<LocalPosition>> local_position_from_env(const GetEnv& getenv) {
  struct Engine {
    const char *rank, *count;
  };
  for (const Engine e : {Engine{"LOCAL_RANK", "LOCAL_WORLD_SIZE"},
                         Engine{"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
                         Engine{"SLURM_LOCALID", nullptr}}) {
    absl::StatusOr<std::optional<int>> rank = int_var(getenv, e.rank);
    if (!rank.ok()) return rank.status();
    if (!rank->has_value()) continue;
    LocalPosition p;
    p.rank = **rank;
    if (e.count != nullptr) {
      absl::StatusOr<std::optional<int>> count = int_var(getenv, e.count);
      if (!count.ok()) return count.status();
      if (!count->has_value() || **count == 0) {
        return absl::InvalidArgumentError(absl::StrCat(e.rank, " is set but ", e.count, " is ",
                                                       count->has_value() ? "0" : "not set"));
      }
      p.workers = **count;
      p.from = absl::StrCat(e.rank, " and ", e.count);
    } else {
      p.workers = slurm_tasks_here(getenv);
      if (p.workers == 0) {
        return absl::InvalidArgumentError(
            "SLURM_LOCALID is set but not this node's tasks (SLURM_NODEID with "
            "SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE, or SLURM_NTASKS_PER_NODE)");
      }
      p.from = "SLURM_LOCALID and SLURM's tasks per node";
    }
    if (p.rank >= p.workers) {
      return absl::InvalidArgumentError(
          absl::StrCat("local rank ", p.rank, " of ", p.workers, " workers (", p.from, ")"));
    }
    return std::optional<LocalPosition>(p);
  }
  return std::optional<LocalPosition>();
}

std::string world_on_this_host(const GetEnv& getenv, int world) {
  int n = 0;
  auto said = [](const char* v, const char* s, bool yes) {
    return yes ? absl::StrCat(v, "=", s) : std::string();
  };
  for (const char* v : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"}) {
    if (const char* s = getenv(v); s != nullptr)
      return said(v, s, absl::SimpleAtoi(s, &n) && n == world);
  }
  for (const char* v : {"SLURM_STEP_NUM_NODES", "SLURM_NNODES"}) {
    if (const char* s = getenv(v); s != nullptr)
      return said(v, s, absl::SimpleAtoi(s, &n) && n == 1);
  }
  return {};
}

absl::StatusOr<std::optional<WorldPosition>> world_from_env(const GetEnv& getenv,
                                                            const MasterFlags& flags) {
  std::optional<WorldPosition> p;
  for (auto [rank, world, local, engine] :
       {std::tuple{"RANK", "WORLD_SIZE", "LOCAL_RANK", "torchrun"},
        std::tuple{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                   "OpenMPI"},
        std::tuple{"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM"}}) {
    auto found = from(getenv, rank, world, local, engine);
    if (!found.ok()) return found.status();
    if (*found) {
      p = std::move(*found);
      break;
    }
  }
  if (!p) return p;
  // The master: the engine's (torchrun), the flag, or SLURM's first host.
  if (const char* a = getenv("MASTER_ADDR"); a != nullptr && *a != '\0') {
    p->master_addr = a;
  } else if (!flags.master_addr.empty()) {
    p->master_addr = flags.master_addr;
  } else if (const char* nodes = getenv("SLURM_JOB_NODELIST"); nodes != nullptr) {
    auto hosts = expand_slurm_hostlist(nodes);
    if (!hosts.ok())
      return absl::InvalidArgumentError(
          absl::StrCat("SLURM_JOB_NODELIST: ", hosts.status().message()));
    if (!hosts->empty()) p->master_addr = hosts->front();
  }
  if (p->master_addr.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(p->engine,
                     " started this worker without a master address: pass --master-addr (the host "
                     "of rank 0) or set MASTER_ADDR"));
  }
  auto port = int_var(getenv, "MASTER_PORT");
  if (!port.ok()) return port.status();
  p->master_port = port->value_or(flags.master_port > 0 ? flags.master_port : kDefaultMasterPort);
  if (p->master_port < 1 || p->master_port > 65535)
    return absl::InvalidArgumentError(
        absl::StrCat("master port ", p->master_port, " out of range"));
  return p;
}

}  // namespace troupe::launcher
