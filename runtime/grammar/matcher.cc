#include "runtime/grammar/matcher.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dpl::grammar {

// ---------------------------------------------------------------- Vocabulary

Vocabulary::Vocabulary(std::vector<std::string> pieces, std::vector<TokenKind> kinds)
    : pieces_(std::move(pieces)), kinds_(std::move(kinds)) {
  kinds_.resize(pieces_.size(), TokenKind::kNever);
  std::vector<int32_t> order;
  for (int32_t i = 0; i < size(); ++i) {
    if (kinds_[i] == TokenKind::kEndOfGeneration) eog_.push_back(i);
    if (kinds_[i] == TokenKind::kText && !pieces_[i].empty()) order.push_back(i);
    if (kinds_[i] == TokenKind::kControl && !pieces_[i].empty()) controls_.try_emplace(pieces_[i], i);
  }
  // Sorted by bytes (a prefix first), then id. Compared by a key of the
  // first 8 bytes (big-endian, zero-padded: its order agrees with the
  // bytes'), the bytes only on a tie; the sorted tokens' bytes are copied
  // together for the walk below, whose vectors are reserved. qwen2's
  // 151,936 tokens on the dev box, VocabularyFromTokenizer in a fresh
  // process (grammar_bench): 244-250 ms with a sort of the strings and a
  // walk of them where they lie, 94-97 ms so (most of the rest: first
  // touches of the trie's pages).
  struct Key {
    uint64_t prefix;
    int32_t id;
  };
  std::vector<Key> keys;
  keys.reserve(order.size());
  for (int32_t id : order) {
    uint64_t k = 0;
    const std::string& p = pieces_[id];
    for (size_t i = 0; i < 8; ++i) k = (k << 8) | (i < p.size() ? static_cast<uint8_t>(p[i]) : 0);
    keys.push_back({k, id});
  }
  std::sort(keys.begin(), keys.end(), [&](const Key& a, const Key& b) {
    if (a.prefix != b.prefix) return a.prefix < b.prefix;
    const int c = pieces_[a.id].compare(pieces_[b.id]);
    return c != 0 ? c < 0 : a.id < b.id;
  });
  std::string bytes;  // the sorted tokens' bytes, one after another
  size_t n_bytes = 0;
  for (int32_t id : order) n_bytes += pieces_[id].size();
  bytes.reserve(n_bytes);
  std::vector<uint32_t> start(keys.size() + 1, 0);
  for (size_t i = 0; i < keys.size(); ++i) {
    order[i] = keys[i].id;
    bytes += pieces_[keys[i].id];
    start[i + 1] = static_cast<uint32_t>(bytes.size());
  }
  const auto length = [&](size_t i) { return start[i + 1] - start[i]; };
  const auto byte_at = [&](size_t i, size_t depth) { return static_cast<uint8_t>(bytes[start[i] + depth]); };
  tokens_.reserve(order.size());
  // Breadth first: each node's children are laid out together. Node q's
  // item (nodes and items are pushed together) holds the sorted tokens
  // [lo, hi) under it, all sharing `depth` bytes; those exactly `depth`
  // long come first (a prefix sorts first).
  struct Item {
    uint32_t lo, hi, depth;
  };
  // A node is a distinct prefix: at most one a byte, plus the root.
  nodes_.reserve(n_bytes + 1);
  std::vector<Item> queue;
  queue.reserve(n_bytes + 1);
  nodes_.push_back(Node{});
  queue.push_back({0, static_cast<uint32_t>(order.size()), 0});
  for (size_t q = 0; q < queue.size(); ++q) {
    const Item it = queue[q];
    uint32_t i = it.lo;
    nodes_[q].first_token = static_cast<uint32_t>(tokens_.size());
    while (i < it.hi && length(i) == it.depth) tokens_.push_back(order[i++]);
    nodes_[q].n_tokens = static_cast<uint32_t>(tokens_.size()) - nodes_[q].first_token;
    nodes_[q].first_child = static_cast<uint32_t>(nodes_.size());
    while (i < it.hi) {
      const uint8_t b = byte_at(i, it.depth);
      uint32_t j = i;
      while (j < it.hi && byte_at(j, it.depth) == b) ++j;
      Node child;
      child.byte = b;
      queue.push_back({i, j, it.depth + 1});
      nodes_.push_back(child);
      ++nodes_[q].n_children;
      i = j;
    }
  }
}

int32_t Vocabulary::FindControl(absl::string_view text) const {
  auto it = controls_.find(text);
  return it == controls_.end() ? -1 : it->second;
}

// ------------------------------------------------------------------- Matcher

namespace {

// Whether the class at `pos` holds c; *next: the element after the class.
bool MatchClass(const Element* pos, uint32_t c, const Element** next) {
  if (pos->type == ElemType::kCharAny) {
    *next = pos + 1;
    return true;
  }
  if (pos->type == ElemType::kToken) return false;  // a control token, not text
  const bool negated = pos->type == ElemType::kCharNot;
  bool found = false;
  const Element* e = pos;
  do {
    if ((e + 1)->type == ElemType::kCharRngUpper) {
      found = found || (e->value <= c && c <= (e + 1)->value);
      e += 2;
    } else {
      found = found || e->value == c;
      e += 1;
    }
  } while (e->type == ElemType::kCharAlt);
  *next = e;
  return found != negated;
}

// Whether the class at `pos` holds some code point in [lo, hi]. For a
// negated class: unless one excluded item covers the whole range (a class
// whose excluded items only together cover it is let through here and
// rejected when the character finishes).
bool ClassMeetsRange(const Element* pos, uint32_t lo, uint32_t hi) {
  if (pos->type == ElemType::kCharAny) return true;
  if (pos->type == ElemType::kToken) return false;
  const bool negated = pos->type == ElemType::kCharNot;
  const Element* e = pos;
  do {
    uint32_t a = e->value, b = e->value;
    if ((e + 1)->type == ElemType::kCharRngUpper) {
      b = (e + 1)->value;
      e += 2;
    } else {
      e += 1;
    }
    if (!negated && a <= hi && lo <= b) return true;
    if (negated && a <= lo && hi <= b) return false;
  } while (e->type == ElemType::kCharAlt);
  return negated;
}

constexpr uint32_t kMinOfLength[5] = {0, 0, 0x80, 0x800, 0x10000};

}  // namespace

Matcher::Matcher(std::shared_ptr<const Grammar> grammar, const Vocabulary* vocab)
    : grammar_(std::move(grammar)), vocab_(vocab) {
  for (const std::string& text : grammar_->token_texts()) {
    token_ids_.push_back(vocab_ != nullptr ? vocab_->FindControl(text) : -1);
    has_tokens_ = has_tokens_ || token_ids_.back() >= 0;
  }
  const auto& rules = grammar_->rules();
  alternatives_.resize(rules.size());
  for (size_t r = 0; r < rules.size(); ++r) {
    const std::vector<Element>& body = rules[r];
    if (body[0].type == ElemType::kToken) {
      // A token literal's rule: kToken t | its text. One of them.
      alternatives_[r].push_back(token_ids_[body[0].value] >= 0 ? &body[0] : &body[2]);
      continue;
    }
    alternatives_[r].push_back(body.data());
    for (size_t i = 0; i + 1 < body.size(); ++i) {
      if (body[i].type == ElemType::kAlt) alternatives_[r].push_back(&body[i + 1]);
    }
  }
  // The root's alternatives, each a stack.
  std::vector<int32_t> stacks;
  for (const Element* a : alternatives_[grammar_->root()]) {
    if (!Expand(IsEndOfSequence(a->type) ? -1 : NewFrame(a, -1), &stacks)) {
      stacks.clear();  // too ambiguous: nothing is accepted
      break;
    }
  }
  cur_ = Intern(std::move(stacks), Utf8{});
}

int32_t Matcher::NewFrame(const Element* pos, int32_t parent) {
  auto [it, inserted] = frame_ids_.try_emplace(std::make_pair(pos, parent), static_cast<int32_t>(arena_.size()));
  if (inserted) arena_.push_back({pos, parent});
  return it->second;
}

bool Matcher::Expand(int32_t top, std::vector<int32_t>* out) {
  work_.clear();
  work_.push_back(top);
  size_t budget = 16 * kMaxStacks;  // expansions: bounds a blow-up of nullable choices
  while (!work_.empty()) {
    const int32_t t = work_.back();
    work_.pop_back();
    if (t < 0 || IsTerminal(arena_[static_cast<size_t>(t)].pos->type)) {
      out->push_back(t);
      if (out->size() > kMaxStacks) return false;
      continue;
    }
    if (--budget == 0) return false;
    const Frame f = arena_[static_cast<size_t>(t)];  // a reference
    const Element* next = f.pos + 1;
    const int32_t cont = IsEndOfSequence(next->type) ? f.parent : NewFrame(next, f.parent);
    for (const Element* a : alternatives_[f.pos->value]) {
      work_.push_back(IsEndOfSequence(a->type) ? cont : NewFrame(a, cont));
    }
  }
  return true;
}

bool Matcher::Advance(const std::vector<int32_t>& in, uint32_t c, std::vector<int32_t>* out) {
  out->clear();
  for (int32_t t : in) {
    if (t < 0) continue;
    const Frame f = arena_[static_cast<size_t>(t)];
    const Element* next = nullptr;
    if (!MatchClass(f.pos, c, &next)) continue;
    if (!Expand(IsEndOfSequence(next->type) ? f.parent : NewFrame(next, f.parent), out)) {
      overflow_ = true;
      out->clear();
      return false;
    }
  }
  return !out->empty();
}

bool Matcher::AnyAcceptsRange(const std::vector<int32_t>& stacks, uint32_t lo, uint32_t hi) const {
  for (int32_t t : stacks) {
    if (t >= 0 && ClassMeetsRange(arena_[static_cast<size_t>(t)].pos, lo, hi)) return true;
  }
  return false;
}

int32_t Matcher::Intern(std::vector<int32_t> stacks, Utf8 partial) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  std::string key(reinterpret_cast<const char*>(stacks.data()), stacks.size() * sizeof(int32_t));
  key.push_back(static_cast<char>(partial.remaining));
  key.push_back(static_cast<char>(partial.length));
  key.append(reinterpret_cast<const char*>(&partial.value), sizeof(partial.value));
  auto [it, inserted] = state_ids_.try_emplace(std::move(key), static_cast<int32_t>(states_.size()));
  if (inserted) states_.push_back(State{std::move(stacks), partial, std::vector<int32_t>(256, kUnknown)});
  return it->second;
}

int32_t Matcher::Next(int32_t s, uint8_t b) {
  int32_t n = states_[static_cast<size_t>(s)].next[b];
  if (n == kUnknown) {
    n = Compute(s, b);
    states_[static_cast<size_t>(s)].next[b] = n;
  }
  return n;
}

int32_t Matcher::Compute(int32_t s, uint8_t b) {
  Utf8 u = states_[static_cast<size_t>(s)].partial;
  std::vector<int32_t> out;
  if (u.remaining == 0) {
    if (b < 0x80) {
      if (!Advance(states_[static_cast<size_t>(s)].stacks, b, &out)) return kDead;
      return Intern(std::move(out), Utf8{});
    }
    if (b >= 0xC2 && b <= 0xDF) {
      u = {static_cast<uint32_t>(b & 0x1F), 1, 2};
    } else if (b >= 0xE0 && b <= 0xEF) {
      u = {static_cast<uint32_t>(b & 0x0F), 2, 3};
    } else if (b >= 0xF0 && b <= 0xF4) {
      u = {static_cast<uint32_t>(b & 0x07), 3, 4};
    } else {
      return kDead;  // a continuation byte, C0/C1 (overlong) or F5..FF
    }
  } else {
    if ((b & 0xC0) != 0x80) return kDead;
    u.value = (u.value << 6) | (b & 0x3F);
    --u.remaining;
    if (u.remaining == 0) {
      const uint32_t c = u.value;
      if (c < kMinOfLength[u.length] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return kDead;
      if (!Advance(states_[static_cast<size_t>(s)].stacks, c, &out)) return kDead;
      return Intern(std::move(out), Utf8{});
    }
  }
  // An unfinished character: some stack must accept a code point that
  // starts with these bits.
  const int shift = 6 * u.remaining;
  const uint32_t lo = std::max(u.value << shift, kMinOfLength[u.length]);
  const uint32_t hi = std::min((u.value << shift) | ((1u << shift) - 1), 0x10FFFFu);
  if (lo > hi || !AnyAcceptsRange(states_[static_cast<size_t>(s)].stacks, lo, hi)) return kDead;
  return Intern(states_[static_cast<size_t>(s)].stacks, u);
}

int32_t Matcher::TokenStep(int32_t s, int32_t id) {
  if (!has_tokens_ || states_[static_cast<size_t>(s)].partial.remaining != 0) return kDead;
  const std::vector<int32_t> stacks = states_[static_cast<size_t>(s)].stacks;
  std::vector<int32_t> out;
  for (int32_t t : stacks) {
    if (t < 0) continue;
    const Frame f = arena_[static_cast<size_t>(t)];
    if (f.pos->type != ElemType::kToken || token_ids_[f.pos->value] != id) continue;
    const Element* next = f.pos + 1;  // kAlt: the literal's rule ends
    if (!Expand(IsEndOfSequence(next->type) ? f.parent : NewFrame(next, f.parent), &out)) {
      overflow_ = true;
      return kDead;
    }
  }
  if (out.empty()) return kDead;
  return Intern(std::move(out), Utf8{});
}

void Matcher::Reset() {
  // Copy the current state's frames into a fresh arena, bottom first.
  const State cur = states_[static_cast<size_t>(cur_)];
  std::vector<Frame> old = std::move(arena_);
  arena_.clear();
  frame_ids_.clear();
  states_.clear();
  state_ids_.clear();
  masks_.clear();
  std::vector<int32_t> remap(old.size(), -2), chain, stacks;
  for (int32_t top : cur.stacks) {
    chain.clear();
    for (int32_t t = top; t >= 0 && remap[static_cast<size_t>(t)] == -2; t = old[static_cast<size_t>(t)].parent) {
      chain.push_back(t);
    }
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      const Frame& f = old[static_cast<size_t>(*it)];
      remap[static_cast<size_t>(*it)] = NewFrame(f.pos, f.parent < 0 ? -1 : remap[static_cast<size_t>(f.parent)]);
    }
    stacks.push_back(top < 0 ? -1 : remap[static_cast<size_t>(top)]);
  }
  cur_ = Intern(std::move(stacks), cur.partial);
}

absl::Status Matcher::Accept(absl::string_view bytes) {
  if (ended_) return absl::InvalidArgumentError("the grammar already ended");
  int32_t s = cur_;
  for (size_t i = 0; i < bytes.size(); ++i) {
    s = Next(s, static_cast<uint8_t>(bytes[i]));
    if (s == kDead) {
      return absl::InvalidArgumentError(absl::StrCat(
          overflow_ ? "the grammar is too ambiguous (over 4096 parses) at byte " : "the grammar rejects byte ", i,
          " (0x", absl::Hex(static_cast<uint8_t>(bytes[i]), absl::kZeroPad2), ") of the text"));
    }
  }
  cur_ = s;
  if (arena_.size() > kMaxCachedFrames || states_.size() > kMaxCachedStates) Reset();
  return absl::OkStatus();
}

bool Matcher::Allows(const Vocabulary& vocab, int32_t id) {
  if (id < 0 || id >= vocab.size()) return false;
  switch (vocab.kind(id)) {
    case TokenKind::kEndOfGeneration: return ended_ || IsComplete();
    case TokenKind::kNever: return false;
    case TokenKind::kControl: return !ended_ && &vocab == vocab_ && TokenStep(cur_, id) != kDead;
    case TokenKind::kText: break;
  }
  if (ended_ || vocab.piece(id).empty()) return false;
  int32_t s = cur_;
  for (char c : vocab.piece(id)) {
    s = Next(s, static_cast<uint8_t>(c));
    if (s == kDead) return false;
  }
  return true;
}

absl::Status Matcher::AcceptToken(const Vocabulary& vocab, int32_t id) {
  if (id < 0 || id >= vocab.size()) return absl::InvalidArgumentError(absl::StrCat("token ", id, " is outside the vocabulary"));
  switch (vocab.kind(id)) {
    case TokenKind::kEndOfGeneration:
      if (!ended_ && !IsComplete()) {
        return absl::InvalidArgumentError("an end-of-generation token before the grammar is complete");
      }
      ended_ = true;
      return absl::OkStatus();
    case TokenKind::kNever:
      return absl::InvalidArgumentError(absl::StrCat("token ", id, " is special: the grammar never allows it"));
    case TokenKind::kControl: {
      const int32_t s = ended_ || &vocab != vocab_ ? kDead : TokenStep(cur_, id);
      if (s == kDead) {
        return absl::InvalidArgumentError(absl::StrCat("control token ", id, " (", vocab.piece(id),
                                                       ") is not a token the grammar names here"));
      }
      cur_ = s;
      if (arena_.size() > kMaxCachedFrames || states_.size() > kMaxCachedStates) Reset();
      return absl::OkStatus();
    }
    case TokenKind::kText:
      if (vocab.piece(id).empty()) return absl::InvalidArgumentError(absl::StrCat("token ", id, " has no text"));
      return Accept(vocab.piece(id));
  }
  return absl::InternalError("unknown token kind");
}

bool Matcher::IsComplete() const {
  const State& s = states_[static_cast<size_t>(cur_)];
  return s.partial.remaining == 0 && !s.stacks.empty() && s.stacks.front() == -1;  // sorted: -1 first
}

size_t Matcher::n_stacks() const { return states_[static_cast<size_t>(cur_)].stacks.size(); }

void Matcher::Walk(const Vocabulary& v, uint32_t node, int32_t state, bool root, absl::Span<uint32_t> bits,
                   int32_t* count) {
  const Vocabulary::Node& n = v.nodes_[node];
  if (!root) {
    for (uint32_t k = 0; k < n.n_tokens; ++k) {
      const int32_t id = v.tokens_[n.first_token + k];
      bits[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
      ++*count;
    }
  }
  for (uint32_t c = 0; c < n.n_children; ++c) {
    const uint32_t child = n.first_child + c;
    const int32_t next = Next(state, v.nodes_[child].byte);
    if (next != kDead) Walk(v, child, next, false, bits, count);
  }
}

int32_t Matcher::FillMask(const Vocabulary& vocab, absl::Span<uint32_t> bits) {
  if (mask_vocab_ != &vocab) {
    masks_.clear();
    mask_vocab_ = &vocab;
  }
  if (!ended_) {
    for (const auto& [state, mask] : masks_) {
      if (state == cur_ && mask.size() == bits.size()) {
        std::copy(mask.begin(), mask.end(), bits.begin());
        int32_t count = 0;
        for (uint32_t w : mask) count += __builtin_popcount(w);
        return count;
      }
    }
  }
  std::fill(bits.begin(), bits.end(), 0u);
  int32_t count = 0;
  if (!ended_) Walk(vocab, 0, cur_, true, bits, &count);
  if (has_tokens_ && !ended_ && &vocab == vocab_) {
    // The control tokens the state's token literals name (not in the trie).
    const State& s = states_[static_cast<size_t>(cur_)];
    for (int32_t t : s.stacks) {
      if (t < 0 || s.partial.remaining != 0) continue;
      const Element* pos = arena_[static_cast<size_t>(t)].pos;
      if (pos->type != ElemType::kToken) continue;
      const int32_t id = token_ids_[pos->value];  // resolved: unresolved literals are their text
      uint32_t& word = bits[static_cast<size_t>(id) >> 5];
      if ((word >> (id & 31) & 1) == 0) {
        word |= 1u << (id & 31);
        ++count;
      }
    }
  }
  if (ended_ || IsComplete()) {
    for (int32_t id : vocab.end_of_generation()) {
      bits[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
      ++count;
    }
  }
  if (!ended_) {
    if (masks_.size() >= 4) masks_.erase(masks_.begin());
    masks_.emplace_back(cur_, std::vector<uint32_t>(bits.begin(), bits.end()));
  }
  return count;
}

}  // namespace dpl::grammar
