// SentencePiece's BPE over one raw fragment, as llama.cpp's
// llm_tokenizer_spm_session (reproduced exactly, token for token):
//   1. one symbol per UTF-8 character, linked left to right;
//   2. every adjacent pair whose joined text is a token enters a queue,
//      highest token score first, ties to the leftmost pair;
//   3. the best pair still intact merges (the right symbol joins the left)
//      and the new neighbours enter the queue, until it is empty;
//   4. each final symbol is its token if its text is one, else it splits
//      back into the two symbols it was merged from (recursively), and a
//      symbol that is no token and no merge comes out byte by byte as
//      <0xXX> tokens.
#include <queue>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "runtime/tokenizer/vocab.h"

namespace dpl::tokenizer {
namespace {

struct Symbol {
  int prev;
  int next;
  const char* text;
  size_t n;  // 0 once merged into its left neighbour
};

struct Bigram {
  int left;
  int right;
  float score;
  size_t size;  // bytes of the joined text, to spot pairs changed since queued
};

struct BigramOrder {  // the queue's top: highest score, then leftmost
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

size_t Utf8Len(char c) {
  const uint8_t b = static_cast<uint8_t>(c);
  return b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 1;
}

class Session {
 public:
  explicit Session(const Vocab& v) : v_(v) {}

  void Tokenize(absl::string_view text, std::vector<int32_t>& out) {
    for (size_t off = 0; off < text.size();) {
      const size_t len = std::min(Utf8Len(text[off]), text.size() - off);
      const int i = static_cast<int>(symbols_.size());
      symbols_.push_back({i - 1, off + len == text.size() ? -1 : i + 1, text.data() + off, len});
      off += len;
    }
    for (int i = 1; i < static_cast<int>(symbols_.size()); ++i) TryAdd(i - 1, i);
    while (!queue_.empty()) {
      const Bigram b = queue_.top();
      queue_.pop();
      Symbol& l = symbols_[b.left];
      Symbol& r = symbols_[b.right];
      if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // stale
      l.n += r.n;
      r.n = 0;
      l.next = r.next;
      if (r.next >= 0) symbols_[r.next].prev = b.left;
      TryAdd(l.prev, b.left);
      TryAdd(b.left, l.next);
    }
    for (int i = symbols_.empty() ? -1 : 0; i != -1; i = symbols_[i].next) Resegment(symbols_[i], out);
  }

 private:
  void TryAdd(int left, int right) {
    if (left == -1 || right == -1) return;
    const absl::string_view joined(symbols_[left].text, symbols_[left].n + symbols_[right].n);
    auto it = v_.text_to_id.find(joined);
    if (it == v_.text_to_id.end()) return;
    queue_.push({left, right, v_.scores[it->second], joined.size()});
    rev_merge_[joined] = {left, right};
  }

  void Resegment(const Symbol& s, std::vector<int32_t>& out) {
    const absl::string_view text(s.text, s.n);
    if (auto it = v_.text_to_id.find(text); it != v_.text_to_id.end()) {
      out.push_back(it->second);
      return;
    }
    auto m = rev_merge_.find(text);
    if (m == rev_merge_.end()) {
      for (char c : text) {
        const int32_t id = v_.byte_token[static_cast<uint8_t>(c)];
        if (id != kNoToken) out.push_back(id);  // llama.cpp would throw: no <0xXX> token
      }
      return;
    }
    Resegment(symbols_[m->second.first], out);
    Resegment(symbols_[m->second.second], out);
  }

  const Vocab& v_;
  std::vector<Symbol> symbols_;
  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue_;
  absl::flat_hash_map<absl::string_view, std::pair<int, int>> rev_merge_;
};

}  // namespace

void EncodeSpm(const Vocab& v, absl::string_view escaped, std::vector<int32_t>& out) {
  Session(v).Tokenize(escaped, out);
}

}  // namespace dpl::tokenizer
