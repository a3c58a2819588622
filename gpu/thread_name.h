// Names the calling thread as perf, gdb, top -H and /proc/PID/task/*/comm
// show it: "troupe:" and what the thread is for ("troupe:stream", ...).
// Linux keeps 15 bytes of a name; a longer one is cut there.
#pragma once

#include <pthread.h>

#include <cstring>
#include <string>

namespace troupe::gpu {

inline void name_this_thread(const char* what) {
  std::string name = std::string("troupe:") + what;
  if (name.size() > 15) name.resize(15);
  pthread_setname_np(pthread_self(), name.c_str());
}

}  // namespace troupe::gpu
