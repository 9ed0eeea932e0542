// Chat templates without a Jinja engine: tokenizer.chat_template is matched
// to a known family from its text (the markers llama.cpp's
// llm_chat_detect_template looks for), and the family's format is written
// here. Each family's name is what FromName and dpl-run's --chat-template
// take (llama.cpp's names where it has one).
//
//   chatml (Qwen2, Qwen2.5): "<|im_start|>{role}\n{content}<|im_end|>\n" per
//     message, then "<|im_start|>assistant\n" for the generation prompt. When
//     the template carries a literal default system prompt (Qwen2: "You are a
//     helpful assistant"; Qwen2.5: "You are Qwen, created by Alibaba Cloud.
//     You are a helpful assistant.") it is inserted as a first system turn
//     when the conversation does not start with one. Plain ChatML has none.
//     Detected by "<|im_start|>" without Qwen3's markers.
//
//   qwen3: ChatML as Qwen3's own Jinja template renders it. Detected by
//     "<|im_start|>" together with "<think>", "</think>" and
//     "enable_thinking". No default system prompt. An assistant message
//     before the last user message keeps only its answer: the text after its
//     last "</think>", leading newlines dropped. An assistant message after
//     the last user message keeps its reasoning as "<think>\n{reasoning}\n
//     </think>\n\n{answer}" (always for the final message, even with empty
//     reasoning). The generation prompt is "<|im_start|>assistant\n"; with
//     ChatOptions::enable_thinking = false (Qwen3's enable_thinking=false) it
//     is followed by an empty "<think>\n\n</think>\n\n", so the model
//     answers without reasoning. Stops as ChatML.
//
//   llama3: "<|start_header_id|>{role}<|end_header_id|>\n\n{trimmed content}
//     <|eot_id|>" per message, then "<|start_header_id|>assistant
//     <|end_header_id|>\n\n". Detected by "<|start_header_id|>" and
//     "<|end_header_id|>".
//
// BOS rule (llama.cpp's): the rendered text never starts with BOS; the caller
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
  kQwen3,
  kLlama3,
};
// The family's name, as FromName accepts it ("chatml", "qwen3", ...).
absl::string_view ChatFamilyName(ChatFamily family);
// Every name FromName accepts, comma-separated ("chatml, llama3, ...").
const std::string& ChatTemplateNames();

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// What a render may vary beyond the messages (the Jinja variables llama.cpp
// passes besides messages and add_generation_prompt).
struct ChatOptions {
  // Qwen3's enable_thinking: false closes an empty <think> block in the
  // generation prompt so the model answers at once. Families without
  // thinking (has_thinking() false) ignore it.
  bool enable_thinking = true;
};

class ChatTemplate {
 public:
  // One of ChatTemplateNames() (no default system prompt); an unknown name is
  // an error listing them.
  static absl::StatusOr<ChatTemplate> FromName(absl::string_view name);
  // Recognizes the family of a Jinja template text (or a template that is
  // just a family name, as llama.cpp allows); error names the choices.
  static absl::StatusOr<ChatTemplate> Detect(absl::string_view jinja);
  // override_name non-empty: FromName(override_name). Otherwise Detect() on
  // tokenizer.chat_template; a missing template is an error naming the
  // override choices.
  static absl::StatusOr<ChatTemplate> FromMetadata(const formats::Metadata& meta,
                                                   absl::string_view override_name = "");

  ChatFamily family() const { return family_; }
  // Whether ChatOptions::enable_thinking changes the rendering (Qwen3).
  bool has_thinking() const { return family_ == ChatFamily::kQwen3; }
  // Empty when the template inserts none.
  const std::string& default_system_prompt() const { return default_system_; }

  // The prompt text (without a leading BOS) for `messages`. Errors: empty
  // conversation, a role other than system/user/assistant.
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                                     bool add_generation_prompt,
                                     const ChatOptions& options = {}) const;

  // Ids that end the assistant's turn: the tokenizer's end-of-generation ids
  // plus this family's end-of-turn texts found in the vocabulary
  // (ChatML, Qwen3: <|im_end|>, <|endoftext|>; Llama 3: <|eot_id|>,
  // <|eom_id|>, <|end_of_text|>). Sorted, unique.
  std::vector<int32_t> StopTokens(const Tokenizer& tokenizer) const;

 private:
  ChatFamily family_ = ChatFamily::kChatML;
  std::string default_system_;
};

// Render + Encode(add_bos = adds_bos_by_default(), parse_special = true).
absl::StatusOr<std::vector<int32_t>> EncodeChat(const Tokenizer& tokenizer,
                                                const ChatTemplate& chat_template,
                                                const std::vector<ChatMessage>& messages,
                                                bool add_generation_prompt,
                                                const ChatOptions& options = {});

}  // namespace dpl::tokenizer
