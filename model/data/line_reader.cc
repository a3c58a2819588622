// Line reading over plain files and zstd streams (libzstd).
#include "model/data/line_reader.h"

#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace troupe::model::data {

absl::StatusOr<std::unique_ptr<LineReader>> LineReader::open(const std::string& path) {
  std::unique_ptr<LineReader> r(new LineReader());
  r->path_ = path;
  r->file_ = std::fopen(path.c_str(), "rb");
  if (r->file_ == nullptr) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open (", std::strerror(errno), ")"));
  }
  std::fseek(r->file_, 0, SEEK_END);
  r->file_size_ = static_cast<std::uint64_t>(std::ftell(r->file_));
  std::fseek(r->file_, 0, SEEK_SET);
  // Reads of 1 MiB, or of the whole file when it is smaller: a small file
  // does not cost a zeroed megabyte (a -1 from ftell, a pipe, gives 1 MiB).
  r->in_.resize(static_cast<std::size_t>(std::clamp<std::uint64_t>(r->file_size_, 1, 1 << 20)));
  if (absl::EndsWith(path, ".zst")) {
    ZSTD_DStream* z = ZSTD_createDStream();
    ZSTD_initDStream(z);
    r->zstd_ = z;
  }
  return r;
}

LineReader::~LineReader() {
  if (zstd_ != nullptr) ZSTD_freeDStream(static_cast<ZSTD_DStream*>(zstd_));
  if (file_ != nullptr) std::fclose(file_);
}

bool LineReader::fill() {
  if (eof_) return false;
  // Drop what has been consumed.
  buffer_.erase(0, pos_);
  pos_ = 0;
  for (;;) {
    if (in_pos_ == in_size_) {
      in_size_ = std::fread(in_.data(), 1, in_.size(), file_);
      in_pos_ = 0;
      bytes_read_ += in_size_;
      if (in_size_ == 0) {
        eof_ = true;
        if (std::ferror(file_)) {
          status_ = absl::DataLossError(absl::StrCat(path_, ": read error"));
        } else if (zstd_ != nullptr && zstd_pending_ != 0) {
          status_ = absl::DataLossError(absl::StrCat(path_, ": truncated zstd stream"));
        }
        return false;
      }
    }
    if (zstd_ == nullptr) {
      buffer_.append(in_.data() + in_pos_, in_size_ - in_pos_);
      in_pos_ = in_size_;
      return true;
    }
    ZSTD_inBuffer in{in_.data(), in_size_, in_pos_};
    const std::size_t start = buffer_.size();
    buffer_.resize(start + ZSTD_DStreamOutSize());
    ZSTD_outBuffer out{buffer_.data() + start, ZSTD_DStreamOutSize(), 0};
    const std::size_t rc = ZSTD_decompressStream(static_cast<ZSTD_DStream*>(zstd_), &out, &in);
    buffer_.resize(start + out.pos);
    in_pos_ = in.pos;
    zstd_pending_ = rc;
    if (ZSTD_isError(rc)) {
      status_ = absl::DataLossError(absl::StrCat(path_, ": corrupt zstd stream at compressed byte ",
                                                 bytes_read_ - (in_size_ - in_pos_), ": ",
                                                 ZSTD_getErrorName(rc)));
      eof_ = true;
      return false;
    }
    if (out.pos > 0) return true;
  }
}

bool LineReader::next(std::string* line) {
  for (;;) {
    const std::size_t nl = buffer_.find('\n', pos_);
    if (nl != std::string::npos) {
      line->assign(buffer_, pos_, nl - pos_);
      pos_ = nl + 1;
      return true;
    }
    if (!fill()) {
      if (!status_.ok()) return false;
      if (pos_ < buffer_.size()) {  // a last line without '\\n'
        line->assign(buffer_, pos_, std::string::npos);
        pos_ = buffer_.size();
        return true;
      }
      return false;
    }
  }
}

}  // namespace troupe::model::data
