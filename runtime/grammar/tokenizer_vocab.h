// A model's vocabulary as the grammar mask sees it: each token's bytes
// (Tokenizer::TokenToPiece), unknown / unused tokens never allowed, the
// end-of-generation ones (Tokenizer::IsEndOfGeneration) allowed when the
// grammar is complete, control tokens (TokenType::kControl: <|im_start|>,
// Mistral's [TOOL_CALLS]) kept with their text as TokenKind::kControl:
// allowed only where a grammar's token literal names that text.
#pragma once

#include "runtime/grammar/matcher.h"
#include "runtime/tokenizer/tokenizer.h"

namespace dpl::grammar {

Vocabulary VocabularyFromTokenizer(const tokenizer::Tokenizer& tok);

}  // namespace dpl::grammar
