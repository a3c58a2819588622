// safetensors parsing and writing with nlohmann::json for the header.
#include "model/safetensors.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "model/atomic_file.h"

namespace troupe::model {
namespace {

absl::Status bad(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

}  // namespace

std::size_t safetensors_dtype_size(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL") return 1;
  return 0;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::open(const std::string& path, Read what) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open file"));
  const std::uint64_t file_size = static_cast<std::uint64_t>(in.tellg());
  in.seekg(0);
  if (file_size < 8) return bad(path, "truncated: shorter than the 8-byte header length");
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; i--) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > file_size - 8) {
    return bad(path, absl::StrCat("not a safetensors file, or truncated: header of ", header_len,
                                  " bytes but only ", file_size - 8, " bytes follow"));
  }
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));

  nlohmann::json j = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return bad(path, "header is not a JSON object");

  SafetensorsFile f;
  f.path_ = path;
  const std::uint64_t data_size = file_size - 8 - header_len;
  for (auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) return bad(path, "__metadata__ is not an object");
      for (auto& [k, val] : v.items()) {
        if (!val.is_string())
          return bad(path, absl::StrCat("__metadata__.", k, " is not a string"));
        f.metadata_[k] = val.get<std::string>();
      }
      continue;
    }
    const std::string& tensor = name;  // clang 14 (the fuzz build) cannot capture a binding
    auto where = [&](absl::string_view what) {
      return bad(path, absl::StrCat("tensor '", tensor, "': ", what));
    };
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets")) {
      return where("needs dtype, shape and data_offsets");
    }
    SafetensorsEntry e;
    e.name = name;
    if (!v["dtype"].is_string()) return where("dtype is not a string");
    e.dtype = v["dtype"].get<std::string>();
    const std::size_t esize = safetensors_dtype_size(e.dtype);
    if (esize == 0) return where(absl::StrCat("unknown dtype ", e.dtype));
    if (!v["shape"].is_array()) return where("shape is not an array");
    std::uint64_t numel = 1;
    for (auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) return where("shape has a non-integer dimension");
      // Dimensions are i64 (as in safetensors' Rust crate, usize): one of 2^63
      // or more read back negative, and a 0 elsewhere in the shape made the
      // byte count agree.
      if (d.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX)) {
        return where(absl::StrCat("dimension ", d.get<std::uint64_t>(), " does not fit 63 bits"));
      }
      e.shape.push_back(d.get<std::int64_t>());
      if (__builtin_mul_overflow(numel, d.get<std::uint64_t>(), &numel))
        return where("shape overflows 64 bits");
    }
    auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned()) {
      return where("data_offsets is not [begin, end]");
    }
    e.begin = off[0].get<std::uint64_t>();
    e.end = off[1].get<std::uint64_t>();
    if (e.begin > e.end || e.end > data_size) {
      return where(absl::StrCat("data [", e.begin, ", ", e.end, ") lies outside the ", data_size,
                                " data bytes (truncated file?)"));
    }
    std::uint64_t nbytes = 0;
    if (__builtin_mul_overflow(numel, esize, &nbytes)) return where("shape overflows 64 bits");
    if (e.end - e.begin != nbytes) {
      return where(
          absl::StrCat("holds ", e.end - e.begin, " bytes, its shape and dtype need ", nbytes));
    }
    f.entries_.push_back(std::move(e));
  }
  f.data_start_ = 8 + header_len;
  if (what == Read::kHeader) return f;
  f.data_.resize(data_size);
  in.read(f.data_.data(), static_cast<std::streamsize>(data_size));
  if (static_cast<std::uint64_t>(in.gcount()) != data_size) return bad(path, "short read");
  return f;
}

absl::Status SafetensorsFile::read(const SafetensorsEntry& e, std::vector<char>* out) const {
  out->resize(e.end - e.begin);
  if (!data_.empty() || e.end == e.begin) {
    std::memcpy(out->data(), data_.data() + e.begin, out->size());
    return absl::OkStatus();
  }
  std::ifstream in(path_, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(data_start_ + e.begin));
  in.read(out->data(), static_cast<std::streamsize>(out->size()));
  if (!in || static_cast<std::uint64_t>(in.gcount()) != out->size()) {
    return bad(path_, absl::StrCat("tensor '", e.name, "': short read (the file changed?)"));
  }
  return absl::OkStatus();
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  for (const SafetensorsEntry& e : entries_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

absl::Span<const char> SafetensorsFile::bytes(const SafetensorsEntry& e) const {
  return absl::Span<const char>(data_.data() + e.begin, e.end - e.begin);
}

absl::Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');  // align the data section
  absl::StatusOr<AtomicFile> out = AtomicFile::create(path);
  if (!out.ok()) return out.status();
  unsigned char len_bytes[8];
  const std::uint64_t n = h.size();
  for (int i = 0; i < 8; i++) len_bytes[i] = static_cast<unsigned char>(n >> (8 * i));
  absl::Status st = out->write(len_bytes, 8);
  if (st.ok()) st = out->write(h);
  for (const TensorToWrite& t : tensors) {
    if (st.ok()) st = out->write(t.data, t.nbytes);
  }
  return st.ok() ? out->commit() : st;
}

}  // namespace troupe::model
