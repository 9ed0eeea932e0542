// The text of one generation as a client receives it, piece by piece: never
// a split UTF-8 character (tokenizer::TokenStreamDecoder holds incomplete
// bytes back) and never text that may be the start of a stop string (held
// back until the next tokens prove it is not, or complete it: then the text
// ends before the stop string, as in OpenAI's API).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/tokenizer/tokenizer.h"

namespace dpl::server {

class TextStream {
 public:
  // Empty stop strings are ignored.
  TextStream(const tokenizer::Tokenizer& tokenizer, std::vector<std::string> stop);

  // The text that became safe to send with token `id` (maybe empty). Sets
  // *stopped when a stop string completed: the text before it is returned,
  // the rest is dropped, and the stream should end.
  std::string Push(int32_t id, bool* stopped);
  // At the end of the generation: what was held back (an incomplete UTF-8
  // sequence as raw bytes, a stop-string prefix), cut before a stop string.
  std::string Flush();

 private:
  // Moves what is safe from held_ to the result; `final`: nothing comes after.
  std::string Release(bool final, bool* stopped);

  tokenizer::TokenStreamDecoder utf8_;
  std::vector<std::string> stop_;
  std::string held_;
};

}  // namespace dpl::server
