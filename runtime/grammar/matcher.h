// The state of a grammar after a sequence of bytes, and the per-step token
// mask (llama.cpp's llama_grammar, written anew, with a vocabulary trie).
//
// State: a set of pushdown stacks (llama.cpp's). A stack lists, innermost
// first, the positions still to match in each rule entered; its top is
// always a character class (rule references are expanded as they come:
// a reference is replaced by its continuation, and one stack per
// alternative of the rule is pushed on it). The empty stack means the root
// rule may end here. A code point c moves each stack whose top class
// accepts c past that class (popping finished sequences, expanding the
// references that come up); stacks whose top rejects c die. Stacks are
// persistent linked lists in an arena (a push shares its tail), identical
// stacks are merged. Bytes are decoded as UTF-8 (the grammar is over code
// points): the bytes of an unfinished character are accepted when some
// stack's top class holds a code point that starts with them, and the
// finished character moves the stacks. Overlong forms, surrogates and bytes
// that are not UTF-8 are rejected.
//
// States are interned (equal stack sets are one state, stacks hash-consed)
// and their byte transitions cached: a lazy DFA, so a state's step by a byte
// is computed once per request.
//
// Mask: the vocabulary's token bytes form a trie; one depth-first walk per
// step carries the state down it (a byte = one cached transition),
// pruning a subtree as soon as its prefix is rejected, so the work is the
// number of trie nodes whose prefix the grammar accepts, not
// n_vocab x token length. A token is allowed when the state after its bytes
// is alive. Tokens with empty text, unknown and unused tokens are never
// allowed; end-of-generation tokens are allowed exactly when the grammar is
// complete (the root may end, no character is unfinished), and alone once
// the grammar cannot continue.
//
// Control tokens (<|im_start|>, [TOOL_CALLS], ...) are not in the trie:
// their text never matches a class or a literal, so one never appears
// inside a JSON string whatever its text. A matcher made with a vocabulary
// resolves the grammar's token literals (grammar.h: <text>, <"text">)
// against it: a literal whose text is a control token's becomes that token
// alone (a stack top of its own, kToken; its text alternative dropped), any
// other becomes its text. The mask then adds, after the walk, the control
// tokens named by the current state's kToken tops: one look at the state's
// tops, and only for a grammar that has a resolved literal, so the mask of
// any other grammar costs what it did. Accepting such a token moves exactly
// the stacks whose top names it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "runtime/grammar/grammar.h"

namespace dpl::grammar {

// Stacks a state may hold; an input that would make more is rejected
// ("too ambiguous"), which a practical grammar never reaches.
inline constexpr size_t kMaxStacks = 4096;
// Frames and states a matcher caches before it drops its caches and starts
// them afresh from the current state.
inline constexpr size_t kMaxCachedFrames = size_t{1} << 20;
inline constexpr size_t kMaxCachedStates = 1 << 14;

enum class TokenKind : uint8_t {
  kText,             // its bytes are matched against the grammar
  kNever,            // unknown, unused: never allowed
  kEndOfGeneration,  // allowed when the grammar is complete
  kControl,          // a control token: its bytes never matched; allowed
                     // only where a token literal of its text is expected
};

// A vocabulary's token bytes as a trie (built once per model, shared by
// every request's matcher).
class Vocabulary {
 public:
  // pieces[i]: token i's bytes (a control token's: its text); kinds[i] its
  // kind (same size).
  Vocabulary(std::vector<std::string> pieces, std::vector<TokenKind> kinds);

  int32_t size() const { return static_cast<int32_t>(pieces_.size()); }
  const std::string& piece(int32_t id) const { return pieces_[static_cast<size_t>(id)]; }
  TokenKind kind(int32_t id) const { return kinds_[static_cast<size_t>(id)]; }
  const std::vector<int32_t>& end_of_generation() const { return eog_; }
  // The control token whose text is exactly `text` (the lowest id if
  // several), or -1.
  int32_t FindControl(absl::string_view text) const;
  size_t n_nodes() const { return nodes_.size(); }
  // Words of a mask bitset for this vocabulary: bit (id % 32) of word id / 32.
  size_t mask_words() const { return (pieces_.size() + 31) / 32; }

 private:
  friend class Matcher;
  struct Node {
    uint32_t first_child = 0;  // children are contiguous, in byte order
    uint32_t n_children = 0;
    uint32_t first_token = 0;  // tokens_[first_token, +n_tokens) end here
    uint32_t n_tokens = 0;
    uint8_t byte = 0;          // the edge from the parent
  };
  std::vector<std::string> pieces_;
  std::vector<TokenKind> kinds_;
  std::vector<int32_t> eog_;
  absl::flat_hash_map<std::string, int32_t> controls_;  // text -> id
  std::vector<Node> nodes_;  // nodes_[0]: the root (the empty prefix)
  std::vector<int32_t> tokens_;
};

class Matcher {
 public:
  // The grammar's token literals are resolved against `vocab` (which must
  // outlive the matcher, and be the one its masks and tokens are asked
  // with): a literal whose text is one of its control tokens matches that
  // token alone. Without a vocabulary every literal is its text.
  explicit Matcher(std::shared_ptr<const Grammar> grammar, const Vocabulary* vocab = nullptr);

  // Moves the state over `bytes`. An error (InvalidArgument: the grammar
  // rejects byte i) leaves the state as it was. (Text only: the text of a
  // literal resolved to a control token is rejected.)
  absl::Status Accept(absl::string_view bytes);
  // A sampled token: its bytes, an end-of-generation token (only when
  // IsComplete(); then ended()), or a control token where a token literal
  // resolved to it is expected (`vocab` the matcher's). Other control
  // tokens, unknown and unused ones and empty texts are refused.
  absl::Status AcceptToken(const Vocabulary& vocab, int32_t id);
  // Whether AcceptToken(vocab, id) would succeed (the state is kept): the
  // token-by-token simulation the mask must equal.
  bool Allows(const Vocabulary& vocab, int32_t id);

  // The root rule may end here (and no UTF-8 character is unfinished).
  bool IsComplete() const;
  // An end-of-generation token was accepted.
  bool ended() const { return ended_; }
  size_t n_stacks() const;

  // The tokens that may come next: bit id of `bits` (vocab.mask_words()
  // words) set when token id is allowed; returns how many are. Every token
  // it allows, AcceptToken accepts, and no other. The last few masks are
  // kept by state: a state seen before (inside a long string every step
  // starts from the same one) costs a copy.
  int32_t FillMask(const Vocabulary& vocab, absl::Span<uint32_t> bits);
  // Drops the kept masks (the transitions stay cached): for benchmarks.
  void ForgetMasks() { masks_.clear(); }

 private:
  // A stack frame, hash-consed: equal (pos, parent) is one frame, so equal
  // stacks are one index and a stack set is a sorted vector of indices.
  struct Frame {
    const Element* pos;  // the next element to match (a class or a reference)
    int32_t parent;      // the frame below; -1: none
  };
  struct Utf8 {
    uint32_t value = 0;     // bits so far
    uint8_t remaining = 0;  // continuation bytes still to come
    uint8_t length = 0;     // of the character
  };
  // A state, interned: its stack tops (sorted; -1 the empty stack), the
  // unfinished character, and its transitions as they are computed (a lazy
  // DFA over bytes: kUnknown until asked, kDead when rejected).
  static constexpr int32_t kUnknown = -2;
  static constexpr int32_t kDead = -1;
  struct State {
    std::vector<int32_t> stacks;
    Utf8 partial;
    std::vector<int32_t> next;  // 256 entries
  };

  int32_t NewFrame(const Element* pos, int32_t parent);
  // Expands the stack whose top is `top` (references resolved) into `out`;
  // false on overflow.
  bool Expand(int32_t top, std::vector<int32_t>* out);
  // The stacks after code point c; false when none (or overflow).
  bool Advance(const std::vector<int32_t>& in, uint32_t c, std::vector<int32_t>* out);
  bool AnyAcceptsRange(const std::vector<int32_t>& stacks, uint32_t lo, uint32_t hi) const;
  int32_t Intern(std::vector<int32_t> stacks, Utf8 partial);
  // The state after `byte` from state s (cached), or kDead.
  int32_t Next(int32_t s, uint8_t byte);
  int32_t Compute(int32_t s, uint8_t byte);
  // The state after control token `id` from state s (not cached: one step
  // per marker), or kDead.
  int32_t TokenStep(int32_t s, int32_t id);
  // Drops every cache, keeping the current state (when they grow large).
  void Reset();
  void Walk(const Vocabulary& v, uint32_t node, int32_t state, bool root, absl::Span<uint32_t> bits,
            int32_t* count);

  std::shared_ptr<const Grammar> grammar_;
  const Vocabulary* vocab_ = nullptr;  // the token literals' (null: none)
  std::vector<int32_t> token_ids_;     // per token literal: its control token, or -1 (its text)
  bool has_tokens_ = false;            // some literal resolved to a control token
  std::vector<std::vector<const Element*>> alternatives_;  // per rule: each alternative's first element
  std::vector<Frame> arena_;
  absl::flat_hash_map<std::pair<const Element*, int32_t>, int32_t> frame_ids_;
  std::vector<State> states_;
  absl::flat_hash_map<std::string, int32_t> state_ids_;
  int32_t cur_ = kDead;
  bool ended_ = false;
  bool overflow_ = false;  // an expansion went beyond kMaxStacks
  // Masks by state (a few), for the vocabulary they were made for.
  const Vocabulary* mask_vocab_ = nullptr;
  std::vector<std::pair<int32_t, std::vector<uint32_t>>> masks_;
  std::vector<int32_t> work_;  // scratch
};

}  // namespace dpl::grammar
