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
// The [INST] families are rendered as llama.cpp's built-in (non-Jinja)
// renderer writes them, for every template that contains "[INST]" (or is
// named "mistral..."). They have no generation prompt: the text ends with
// "[/INST]" after the last user message, where the assistant answers, and an
// assistant turn ends with "</s>". Stops: the tokenizer's EOS and "</s>".
// (The tokenizer reads Mistral 7B's and Llama 2's SentencePiece
// vocabularies; not yet tekken's pre-tokenizer.)
//
//   mistral-v7 (Mistral Large 2411, Mistral Small 3.x): "[SYSTEM_PROMPT]
//     {system}[/SYSTEM_PROMPT]", "[INST] {user}[/INST]", " {assistant}</s>".
//     Detected by "[SYSTEM_PROMPT]". mistral-v7-tekken is the same without
//     the spaces; as in llama.cpp only its name selects it (Mistral Small
//     3.x's tekken templates are detected as mistral-v7).
//
//   mistral-v3, mistral-v3-tekken, mistral-v1 (the official templates that
//     have "[AVAILABLE_TOOLS]" or "' [INST] ' + system_message"): every
//     turn opens with "[INST] " (v3-tekken "[INST]", v1 " [INST] "); a
//     system message is written there followed by "\n\n", so it is
//     prepended to the next user message; user: "{user}[/INST]" (v1
//     "{user} [/INST]"); assistant: " {assistant}</s>" (v3 trims the
//     assistant text, v3-tekken has no space). v1 is told by " [INST]",
//     v3-tekken by "\"[INST]\"", else v3. Why the system prompt goes first:
//     llama.cpp's renderer does so (Mistral's own v3 Jinja puts it before the
//     last user message), and it keeps a chat's earlier turns, and so its
//     cached prefix, unchanged from one turn to the next.
//
//   llama2, llama2-sys, llama2-sys-bos, llama2-sys-strip (any other [INST]
//     template: Mistral 7B v0.1/v0.2, Llama 2): "[INST] " opens a turn,
//     "{user} [/INST]" closes it, "{assistant}</s>" ends it. llama2 writes
//     a system message as "{system}\n"; the -sys variants (templates with
//     "<<SYS>>") as "<<SYS>>\n{system}\n<</SYS>>\n\n"; -sys-bos (templates
//     with "bos_token + '[INST]") opens every later turn with "<s>[INST] ";
//     -sys-strip (templates with "content.strip()") trims every message.
//
// BOS rule (llama.cpp's): the rendered text never starts with BOS; the caller
// tokenizes it with add_bos = tokenizer.adds_bos_by_default() and
// parse_special = true, so Llama 3 and Mistral get exactly one leading BOS
// (<|begin_of_text|>, <s>) and Qwen none. EncodeChat does exactly that.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
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
  kMistralV7,
  kMistralV7Tekken,
  kMistralV3,
  kMistralV3Tekken,
  kMistralV1,
  kLlama2,
  kLlama2Sys,
  kLlama2SysBos,
  kLlama2SysStrip,
};
// The family's name, as FromName accepts it ("chatml", "qwen3", ...).
absl::string_view ChatFamilyName(ChatFamily family);
// Every name FromName accepts, comma-separated ("chatml, llama3, ...").
const std::string& ChatTemplateNames();

// A function call an assistant message made (OpenAI's tool_calls[i].function).
struct ToolCall {
  std::string name;
  // The arguments as the template writes them: a JSON object in Python's
  // json.dumps spacing (", ", ": "), as Jinja's tojson gives it.
  std::string arguments;
};

struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string r, std::string c, std::vector<ToolCall> calls = {})
      : role(std::move(r)), content(std::move(c)), tool_calls(std::move(calls)) {}

  std::string role;  // "system", "user", "assistant", or "tool" (a call's result)
  std::string content;
  std::vector<ToolCall> tool_calls;  // an assistant message's calls
};

// What a render may vary beyond the messages (the Jinja variables llama.cpp
// passes besides messages and add_generation_prompt).
struct ChatOptions {
  // Qwen3's enable_thinking: false closes an empty <think> block in the
  // generation prompt so the model answers at once. Families without
  // thinking (has_thinking() false) ignore it.
  bool enable_thinking = true;
  // Whether a control token's text inside a message ("<|im_end|>" in a user
  // message) becomes that token (llama-server's behavior: a user can forge
  // turns) or stays text (false, the default: OpenAI's API, where content is
  // only ever content). The template's own markup is tokens either way.
  bool content_specials = false;
  // Tools the model may call (OpenAI's tools[i], each as Jinja's tojson
  // writes it). Only the families with a tools section take them
  // (supports_tools(): ChatML and Qwen3, as Qwen2.5's and Qwen3's templates
  // write them); their text, like the content's, is never special tokens.
  std::vector<std::string> tools;
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
  // Whether the family writes tools, tool calls and tool results (Qwen2.5's
  // and Qwen3's: a "# Tools" system section, <tool_call> JSON in assistant
  // turns, <tool_response> in a user turn) and answers calls that way.
  bool supports_tools() const { return family_ == ChatFamily::kChatML || family_ == ChatFamily::kQwen3; }
  // Empty when the template inserts none.
  const std::string& default_system_prompt() const { return default_system_; }

  // The prompt text (without a leading BOS) for `messages`. The [INST]
  // families ignore add_generation_prompt (they have none). Errors: empty
  // conversation, a role other than system/user/assistant (tool, and tools
  // or tool calls, where supports_tools()).
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                                     bool add_generation_prompt,
                                     const ChatOptions& options = {}) const;

  // Ids that end the assistant's turn: the tokenizer's end-of-generation ids
  // plus this family's end-of-turn texts found in the vocabulary
  // (ChatML, Qwen3: <|im_end|>, <|endoftext|>; Llama 3: <|eot_id|>,
  // <|eom_id|>, <|end_of_text|>; [INST] families: </s>). Sorted, unique.
  std::vector<int32_t> StopTokens(const Tokenizer& tokenizer) const;

 private:
  ChatFamily family_ = ChatFamily::kChatML;
  std::string default_system_;
};

// Render + Encode(add_bos = adds_bos_by_default(), parse_special = true),
// with control-token texts inside message content encoded as plain text
// unless options.content_specials.
absl::StatusOr<std::vector<int32_t>> EncodeChat(const Tokenizer& tokenizer,
                                                const ChatTemplate& chat_template,
                                                const std::vector<ChatMessage>& messages,
                                                bool add_generation_prompt,
                                                const ChatOptions& options = {});

}  // namespace dpl::tokenizer
