// A model's vocabulary as the grammar mask sees it: each token's bytes
// (Tokenizer::TokenToPiece), control / unknown / unused tokens never
// allowed, the end-of-generation ones (Tokenizer::IsEndOfGeneration)
// allowed when the grammar is complete.
#pragma once

#include "runtime/grammar/matcher.h"
#include "runtime/tokenizer/tokenizer.h"

namespace dpl::grammar {

Vocabulary VocabularyFromTokenizer(const tokenizer::Tokenizer& tok);

}  // namespace dpl::grammar
