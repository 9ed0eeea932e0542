#include "runtime/grammar/tokenizer_vocab.h"

#include <string>
#include <vector>

namespace dpl::grammar {

Vocabulary VocabularyFromTokenizer(const tokenizer::Tokenizer& tok) {
  const int32_t n = tok.n_vocab();
  std::vector<std::string> pieces(static_cast<size_t>(n));
  std::vector<TokenKind> kinds(static_cast<size_t>(n), TokenKind::kNever);
  for (int32_t id = 0; id < n; ++id) {
    if (tok.IsEndOfGeneration(id)) {
      kinds[id] = TokenKind::kEndOfGeneration;
      continue;
    }
    if (!tok.has_vocab()) continue;  // ids only: no token has text
    const tokenizer::TokenType t = tok.token_type(id);
    if (t == tokenizer::TokenType::kUnknown || t == tokenizer::TokenType::kUnused) continue;
    pieces[id] = tok.TokenToPiece(id);  // a control token's: its text
    kinds[id] = t == tokenizer::TokenType::kControl ? TokenKind::kControl : TokenKind::kText;
  }
  return Vocabulary(std::move(pieces), std::move(kinds));
}

}  // namespace dpl::grammar
