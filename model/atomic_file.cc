// AtomicFile: unique temporary, checked writes, fsync, rename, fsync of the
// directory.
#include "model/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"

namespace troupe::model {
namespace {

constexpr std::size_t kBuffer = 1 << 20;

std::string reason() { return std::strerror(errno); }

// The directory of `path` ("." for a bare name) and its last component.
std::pair<std::string, std::string> split(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  if (slash == std::string::npos) return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

// "<dir>/.<name>.tmp.<pid>.<n>.<random>": pid and a process-wide counter make
// it unique among this machine's writers; O_EXCL settles any collision left
// (another host on a shared file system), and the caller tries again.
std::string temp_name(const std::string& path) {
  static std::atomic<std::uint64_t> counter{0};
  thread_local std::mt19937_64 random{std::random_device{}()};
  const auto [dir, name] = split(path);
  return absl::StrCat(dir, "/.", name, ".tmp.", ::getpid(), ".", counter++, ".",
                      random() % 1000000);
}

}  // namespace

absl::StatusOr<AtomicFile> AtomicFile::create(const std::string& path, unsigned mode) {
  const auto [dir, name] = split(path);
  if (name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": names a directory, not a file"));
  }
  AtomicFile f;
  f.path_ = path;
  for (int attempt = 0; attempt < 100; attempt++) {
    f.tmp_ = temp_name(path);
    f.fd_ =
        ::open(f.tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, static_cast<mode_t>(mode));
    if (f.fd_ >= 0) break;
    if (errno != EEXIST) {
      const int code = errno;
      const std::string why = reason();
      const std::string what = absl::StrCat(path, ": cannot create a file in ", dir, ": ", why);
      f.tmp_.clear();
      if (code == EACCES || code == EPERM || code == EROFS) {
        return absl::PermissionDeniedError(what);
      }
      return code == ENOENT || code == ENOTDIR ? absl::NotFoundError(what)
                                               : absl::InternalError(what);
    }
  }
  if (f.fd_ < 0) {
    f.tmp_.clear();
    return absl::InternalError(absl::StrCat(path, ": no free temporary name in ", dir));
  }
  f.buffer_.reserve(kBuffer);
  return f;
}

AtomicFile::AtomicFile(AtomicFile&& o) noexcept
    : path_(std::move(o.path_)),
      tmp_(std::move(o.tmp_)),
      fd_(o.fd_),
      buffer_(std::move(o.buffer_)),
      error_(std::move(o.error_)) {
  o.fd_ = -1;
  o.tmp_.clear();
}

AtomicFile& AtomicFile::operator=(AtomicFile&& o) noexcept {
  if (this != &o) {
    discard();
    path_ = std::move(o.path_);
    tmp_ = std::move(o.tmp_);
    fd_ = o.fd_;
    buffer_ = std::move(o.buffer_);
    error_ = std::move(o.error_);
    o.fd_ = -1;
    o.tmp_.clear();
  }
  return *this;
}

AtomicFile::~AtomicFile() { discard(); }

void AtomicFile::discard() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
  tmp_.clear();
  buffer_.clear();
}

absl::Status AtomicFile::fail(absl::Status error) {
  if (error_.ok()) error_ = std::move(error);
  discard();
  return error_;
}

absl::Status AtomicFile::write(const void* data, std::size_t n) {
  if (!error_.ok()) return error_;
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": already closed"));
  const char* p = static_cast<const char*>(data);
  if (buffer_.size() + n <= kBuffer) {
    buffer_.append(p, n);
    return absl::OkStatus();
  }
  if (absl::Status st = flush(); !st.ok()) return st;
  if (n <= kBuffer) {
    buffer_.append(p, n);
    return absl::OkStatus();
  }
  buffer_.assign(p, n);  // a large write goes straight through
  return flush();
}

// Writes the buffer, all of it (write(2) may take less, or be interrupted).
absl::Status AtomicFile::flush() {
  std::size_t done = 0;
  while (done < buffer_.size()) {
    const ssize_t k = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      return fail(absl::DataLossError(
          absl::StrCat(path_, ": cannot write: ", k < 0 ? reason() : "no progress")));
    }
    done += static_cast<std::size_t>(k);
  }
  buffer_.clear();
  return absl::OkStatus();
}

absl::Status AtomicFile::commit() {
  if (!error_.ok()) return error_;
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": already closed"));
  if (absl::Status st = flush(); !st.ok()) return st;
  if (::fsync(fd_) != 0) {
    return fail(absl::DataLossError(absl::StrCat(path_, ": cannot fsync: ", reason())));
  }
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    return fail(absl::DataLossError(absl::StrCat(path_, ": cannot close: ", reason())));
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    return fail(absl::PermissionDeniedError(
        absl::StrCat(path_, ": cannot rename ", tmp_, " into place: ", reason())));
  }
  tmp_.clear();  // it is the file now
  // The rename is durable once the directory is.
  const std::string dir = split(path_).first;
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0 || ::fsync(dfd) != 0) {
    const std::string why = reason();
    if (dfd >= 0) ::close(dfd);
    error_ =
        absl::DataLossError(absl::StrCat(path_, ": cannot fsync its directory ", dir, ": ", why));
    return error_;
  }
  ::close(dfd);
  return absl::OkStatus();
}

absl::Status write_file_atomically(const std::string& path, absl::string_view bytes) {
  absl::StatusOr<AtomicFile> f = AtomicFile::create(path);
  if (!f.ok()) return f.status();
  if (absl::Status st = f->write(bytes); !st.ok()) return st;
  return f->commit();
}

}  // namespace troupe::model
