// Reads a text file line by line, plain or zstd-compressed (by the ".zst"
// suffix), as The Pile ships its jsonl.
//
//   absl::StatusOr<std::unique_ptr<LineReader>> r = LineReader::open("00.jsonl.zst");
//   std::string line;
//   while ((*r)->next(&line)) { ... }
//   RETURN_IF_ERROR((*r)->status());   // a corrupt or truncated stream
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace troupe::model::data {

class LineReader {
 public:
  static absl::StatusOr<std::unique_ptr<LineReader>> open(const std::string& path);
  ~LineReader();

  // The next line without its '\n' (a last line without one counts); false
  // at the end or on an error (then status() says which).
  bool next(std::string* line);
  absl::Status status() const { return status_; }
  // Compressed bytes read so far (for progress in MB/s of input).
  std::uint64_t bytes_read() const { return bytes_read_; }
  std::uint64_t file_size() const { return file_size_; }

 private:
  LineReader() = default;
  bool fill();  // more decompressed bytes into buffer_; false at the end

  std::string path_;
  std::FILE* file_ = nullptr;
  void* zstd_ = nullptr;  // ZSTD_DStream, when compressed
  std::vector<char> in_;
  std::size_t in_pos_ = 0, in_size_ = 0;
  std::string buffer_;
  std::size_t pos_ = 0;
  bool eof_ = false;
  std::size_t zstd_pending_ = 0;  // ZSTD_decompressStream's hint: 0 at a frame's end
  std::uint64_t bytes_read_ = 0, file_size_ = 0;
  absl::Status status_;
};

}  // namespace troupe::model::data
