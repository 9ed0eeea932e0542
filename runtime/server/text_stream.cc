#include "runtime/server/text_stream.h"

#include <algorithm>

namespace dpl::server {

TextStream::TextStream(const tokenizer::Tokenizer& tokenizer, std::vector<std::string> stop)
    : utf8_(tokenizer) {
  for (std::string& s : stop) {
    if (!s.empty()) stop_.push_back(std::move(s));
  }
}

std::string TextStream::Push(int32_t id, bool* stopped) {
  held_ += utf8_.Push(id);
  return Release(false, stopped);
}

std::string TextStream::Flush() {
  held_ += utf8_.Flush();
  bool stopped = false;
  return Release(true, &stopped);
}

std::string TextStream::Release(bool final, bool* stopped) {
  *stopped = false;
  // The earliest complete stop string wins.
  size_t cut = std::string::npos;
  for (const std::string& s : stop_) cut = std::min(cut, held_.find(s));
  if (cut != std::string::npos) {
    *stopped = true;
    std::string out = held_.substr(0, cut);
    held_.clear();
    return out;
  }
  // Hold back the longest tail of held_ that is a proper prefix of a stop
  // string: the next token may complete it.
  size_t keep = 0;
  if (!final) {
    for (const std::string& s : stop_) {
      for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n) {
        if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
          keep = n;
          break;
        }
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

}  // namespace dpl::server
