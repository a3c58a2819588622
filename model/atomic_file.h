// AtomicFile: a file that appears at its path complete, or not at all.
//
// Every file troupe writes whole (weights, sample-index caches, datasets)
// goes through this: the bytes go to a temporary of a unique name in the
// destination's directory (so two writers of one path never share it),
// every write and the close are checked, and commit() fsyncs the file,
// renames it over the path and fsyncs the directory, so that after a crash
// the path holds the old file or the new one, never a part of one. A file
// destroyed (or discard()ed) before commit() removes its temporary and leaves
// the path as it was.
//
//   absl::StatusOr<model::AtomicFile> f = model::AtomicFile::create("out/w.safetensors");
//   if (!f.ok()) return f.status();              // "out/w.safetensors: cannot create ..."
//   if (absl::Status st = f->write(header); !st.ok()) return st;
//   return f->commit();
//
// Errors name the destination path and the system's reason.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace troupe::model {

class AtomicFile {
 public:
  // Creates the temporary (mode 0666 less the umask, as a plain open would;
  // 0600 for a secret such as a job token).
  static absl::StatusOr<AtomicFile> create(const std::string& path, unsigned mode = 0666);

  AtomicFile(AtomicFile&& other) noexcept;
  AtomicFile& operator=(AtomicFile&& other) noexcept;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();  // discard() unless committed

  // Appends (buffered). The first error is kept: commit() returns it too.
  absl::Status write(const void* data, std::size_t n);
  absl::Status write(absl::string_view bytes) { return write(bytes.data(), bytes.size()); }
  // Flush, fsync, close, rename over path(), fsync the directory. After an
  // error the temporary is gone and path() is as it was.
  absl::Status commit();
  // Removes the temporary now; path() is untouched.
  void discard();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_; }

 private:
  AtomicFile() = default;
  absl::Status flush();
  absl::Status fail(absl::Status error);  // keeps the first error, removes the temporary

  std::string path_, tmp_;
  int fd_ = -1;         // -1 once committed or discarded
  std::string buffer_;  // up to kBuffer bytes not yet written
  absl::Status error_;
};

// The whole of `bytes` as the file at `path`, atomically.
absl::Status write_file_atomically(const std::string& path, absl::string_view bytes);

}  // namespace troupe::model
