// Reading and writing safetensors files (Hugging Face's format): an 8-byte
// little-endian header length, a JSON header mapping each tensor name to
// {dtype, shape, data_offsets} plus an optional "__metadata__" of strings,
// then the tensor bytes.
//
//   absl::StatusOr<SafetensorsFile> f = SafetensorsFile::open("gpt2.safetensors");
//   const SafetensorsEntry* e = f->find("wte.weight");
//   absl::Span<const char> bytes = f->bytes(*e);
//
// Every problem (truncated file, bad header, offsets outside the data, a
// dtype/shape that disagrees with the byte count) is an InvalidArgument or
// NotFound naming the file and, where there is one, the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace troupe::model {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "F32", "I32", "F64", "BF16", ...
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // byte offsets into the data section
};

class SafetensorsFile {
 public:
  // kWhole reads the data section into memory; kHeader only the header
  // (read() then reads one tensor's bytes from the file).
  enum class Read { kWhole, kHeader };
  static absl::StatusOr<SafetensorsFile> open(const std::string& path, Read what = Read::kWhole);

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* find(const std::string& name) const;
  absl::Span<const char> bytes(const SafetensorsEntry& e) const;  // kWhole
  // One tensor's bytes, read from the file (either mode).
  absl::Status read(const SafetensorsEntry& e, std::vector<char>* out) const;

 private:
  std::string path_;
  std::vector<char> data_;        // the data section (kWhole)
  std::uint64_t data_start_ = 0;  // its offset in the file
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

struct TensorToWrite {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  const void* data = nullptr;
  std::size_t nbytes = 0;
};

// Writes atomically (model/atomic_file.h): a uniquely named temporary in
// the same directory, fsynced and renamed over `path`, the directory
// fsynced; `path` holds the old file or the whole new one, never a part.
absl::Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                               const std::map<std::string, std::string>& metadata);

std::size_t safetensors_dtype_size(const std::string& dtype);  // 0 if unknown

}  // namespace troupe::model
