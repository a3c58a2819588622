// Fuzzes the safetensors reader (SafetensorsFile::open).
//
// Checks: a rejected file has a message naming it; in an accepted one every
// tensor's dimensions are non-negative, its bytes lie in the data section and
// number exactly elements x dtype size, and find() finds it.
#include <cstdint>

#include "fuzz/fuzz_util.h"
#include "model/safetensors.h"

using troupe::model::SafetensorsFile;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = troupe::fuzz::scratch_path("w.safetensors");
  troupe::fuzz::write_file(path, absl::string_view(reinterpret_cast<const char*>(data), size));
  auto f = SafetensorsFile::open(path);
  if (!f.ok()) {
    FUZZ_CHECK(f.status().message().find(path) != absl::string_view::npos);
    return 0;
  }
  for (const auto& e : f->entries()) {
    unsigned __int128 numel = 1;
    for (std::int64_t dim : e.shape) {
      FUZZ_CHECK(dim >= 0);
      numel *= static_cast<std::uint64_t>(dim);
    }
    FUZZ_CHECK(e.begin <= e.end && e.end <= size);
    FUZZ_CHECK(numel * troupe::model::safetensors_dtype_size(e.dtype) == e.end - e.begin);
    absl::Span<const char> b = f->bytes(e);
    FUZZ_CHECK(b.size() == e.end - e.begin);
    unsigned sum = 0;  // touch every byte (ASan checks the span)
    for (char c : b) sum += static_cast<unsigned char>(c);
    (void)sum;
    FUZZ_CHECK(f->find(e.name) != nullptr);
  }
  return 0;
}
