// What one recorded event costs, measured alone (Google Benchmark): the
// figures bench/trace_bench.py multiplies by the events a step records.
//
//   record        Recorder::record of a finished event (a TP phase)
//   open_close    Recorder::open + close (a message, a wait)
//   mark_stream   a stream op bracketed by the two host callbacks that time
//                 it, against the same op unmarked (the difference is the
//                 marking: two callbacks, a handle, open + close)
#include <benchmark/benchmark.h>

#include "actors/diagnostics/trace_marks.h"
#include "comm/trace.h"
#include "gpu/device.h"

namespace troupe {
namespace {

namespace trace = comm::trace;

void BM_Record(benchmark::State& state) {
  trace::Recorder rec(4096);
  trace::Event e;
  e.kind = trace::Kind::kPhase;
  e.step = 1;
  for (auto _ : state) rec.record(e);
}
BENCHMARK(BM_Record);

void BM_OpenClose(benchmark::State& state) {
  trace::Recorder rec(4096);
  trace::Event e;
  e.kind = trace::Kind::kRecv;
  e.step = 1;
  for (auto _ : state) rec.close(rec.open(e));
}
BENCHMARK(BM_OpenClose);

// Ops of nothing on a CPU stream, 256 per synchronize; marked or not.
void BM_StreamOp(benchmark::State& state) {
  const bool marked = state.range(0) != 0;
  std::unique_ptr<gpu::Stream> s = gpu::cpu_device().make_stream({.threads = 1});
  trace::Recorder rec(4096);
  actors::RankTrace rt;
  rt.recorder = &rec;
  trace::Event e;
  e.kind = trace::Kind::kForward;
  e.step = 1;
  for (auto _ : state) {
    for (int i = 0; i < 256; i++) {
      auto op = [&] { s->host_callback([] {}); };
      if (marked) {
        actors::mark_stream(&rt, *s, e, op, /*set_current=*/true);
      } else {
        op();
      }
    }
    (void)s->synchronize();
  }
  state.SetItemsProcessed(state.iterations() * 256);
}
BENCHMARK(BM_StreamOp)->Arg(0)->Arg(1)->ArgName("marked");

}  // namespace
}  // namespace troupe

BENCHMARK_MAIN();
