// The checkpoint manifest as JSON (model/checkpoint.h), internal to
// model/checkpoint*.cc: every field is checked on the way in, and a bad one
// is an InvalidArgument naming it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/checkpoint.h"

namespace troupe::model::ckpt {

// zlib's CRC-32 of n bytes (the records' checksums).
std::uint32_t crc_of(const void* data, std::size_t n);

nlohmann::json record_json(const TensorRecord& r);
absl::StatusOr<TensorRecord> record_from_json(const nlohmann::json& j);

std::string manifest_text(const Meta& meta, const std::vector<TensorRecord>& records);
// `path` names the manifest in errors.
absl::Status parse_manifest(const std::string& text, const std::string& path, Meta* meta,
                            std::vector<TensorRecord>* records);

}  // namespace troupe::model::ckpt
