// Chat templates without a Jinja engine: tokenizer.chat_template is matched
// to a known family from its text, and the family's format is written here.
//
//   ChatML (Qwen): "<|im_start|>{role}\n{content}<|im_end|>\n" per message,
//     then "<|im_start|>assistant\n" for the generation prompt. When the
//     template carries a literal default system prompt (Qwen2: "You are a
//     helpful assistant"; Qwen2.5: "You are Qwen, created by Alibaba Cloud.
//     You are a helpful assistant.") it is inserted as a first system turn
//     when the conversation does not start with one. Plain ChatML has none.
//   Llama 3: "<|start_header_id|>{role}<|end_header_id|>\n\n{trimmed content}
//     <|eot_id|>" per message, then "<|start_header_id|>assistant
//     <|end_header_id|>\n\n".
//
// BOS rule (llama.cpp's): the rendered text never contains BOS; the caller
// tokenizes it with add_bos = tokenizer.adds_bos_by_default() and
// parse_special = true, so Llama 3 gets exactly one <|begin_of_text|> and Qwen
// none. EncodeChat does exactly that.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "formats/metadata.h"
#include "runtime/tokenizer/tokenizer.h"

namespace dpl::tokenizer {

enum class ChatFamily : uint8_t {
  kChatML,
  kLlama3,
};
// "chatml" / "llama3": the names FromName accepts.
absl::string_view ChatFamilyName(ChatFamily family);

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

class ChatTemplate {
 public:
  // "chatml" or "llama3" (no default system prompt).
  static absl::StatusOr<ChatTemplate> FromName(absl::string_view name);
  // Recognizes the family of a Jinja template text; error names the choices.
  static absl::StatusOr<ChatTemplate> Detect(absl::string_view jinja);
  // override_name non-empty: FromName(override_name). Otherwise Detect() on
  // tokenizer.chat_template; a missing template is an error naming the
  // override choices.
  static absl::StatusOr<ChatTemplate> FromMetadata(const formats::Metadata& meta,
                                                   absl::string_view override_name = "");

  ChatFamily family() const { return family_; }
  // Empty when the template inserts none.
  const std::string& default_system_prompt() const { return default_system_; }

  // The prompt text (without BOS) for `messages`. Errors: empty conversation,
  // a role other than system/user/assistant.
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                                     bool add_generation_prompt) const;

  // Ids that end the assistant's turn: the tokenizer's end-of-generation ids
  // plus this family's end-of-turn texts found in the vocabulary
  // (ChatML: <|im_end|>, <|endoftext|>; Llama 3: <|eot_id|>, <|eom_id|>,
  // <|end_of_text|>). Sorted, unique.
  std::vector<int32_t> StopTokens(const Tokenizer& tokenizer) const;

 private:
  ChatFamily family_ = ChatFamily::kChatML;
  std::string default_system_;
};

// Render + Encode(add_bos = adds_bos_by_default(), parse_special = true).
absl::StatusOr<std::vector<int32_t>> EncodeChat(const Tokenizer& tokenizer,
                                                const ChatTemplate& chat_template,
                                                const std::vector<ChatMessage>& messages,
                                                bool add_generation_prompt);

}  // namespace dpl::tokenizer
