// Helpers shared by the fuzz targets: scratch files (the parsers read
// files) and a check that aborts, so libFuzzer reports the input.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/string_view.h"

namespace troupe::fuzz {

// FUZZ_CHECK(cond) << nothing: prints the failed condition and aborts.
#define FUZZ_CHECK(cond)                                                                 \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

// A per-process scratch path "<dir>/troupe_fuzz_<pid>_<name>", removed
// (with what is under it) at exit. <dir>: TROUPE_FUZZ_TMPDIR, else /dev/shm
// (a file system in memory: /tmp on disk made the targets 25x slower), else
// /tmp.
inline std::string scratch_path(absl::string_view name) {
  static std::vector<std::string> paths;
  if (paths.empty()) {
    std::atexit([] {
      std::error_code ec;
      for (const std::string& p : paths) std::filesystem::remove_all(p, ec);
    });
  }
  const char* env = std::getenv("TROUPE_FUZZ_TMPDIR");
  std::string dir = env != nullptr && *env != '\0' ? env : "/tmp";
  if (env == nullptr && ::access("/dev/shm", W_OK) == 0) dir = "/dev/shm";
  paths.push_back(dir + "/troupe_fuzz_" + std::to_string(::getpid()) + "_" + std::string(name));
  return paths.back();
}

// Replaces `path` with exactly `bytes`.
inline void write_file(const std::string& path, absl::string_view bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  FUZZ_CHECK(fd >= 0);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    FUZZ_CHECK(n > 0);
    done += static_cast<std::size_t>(n);
  }
  FUZZ_CHECK(::close(fd) == 0);
}

// Splits an input in two: a little-endian u16 length n, then n bytes (the
// first file), then the rest (the second).
inline std::pair<absl::string_view, absl::string_view> split_two(const std::uint8_t* data,
                                                                 std::size_t size) {
  if (size < 2) return {};
  std::size_t n = static_cast<std::size_t>(data[0]) | (static_cast<std::size_t>(data[1]) << 8);
  const auto* p = reinterpret_cast<const char*>(data) + 2;
  size -= 2;
  if (n > size) n = size;
  return {absl::string_view(p, n), absl::string_view(p + n, size - n)};
}

}  // namespace troupe::fuzz
