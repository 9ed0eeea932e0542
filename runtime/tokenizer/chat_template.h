// Chat templates, rendered two ways.
//
// jinja() mode: a model's own tokenizer.chat_template, or a file given with
// --chat-template-file, rendered by minja (third_party/minja, the Jinja
// engine llama.cpp uses) with the variables llama.cpp passes: messages
// (OpenAI-style {role, content}; an assistant's calls as tool_calls
// [{type: "function", function: {name, arguments: <object>}}] with their id,
// and a tool result's tool_call_id, where the client gave them),
// add_generation_prompt, bos_token and eos_token (the vocabulary's texts),
// tools (parsed JSON objects, only when given), enable_thinking and
// strftime_now. As llama.cpp's minja wrapper does, a template that drops or
// refuses a system message (tried once at load with a sample one) gets the
// system messages folded into the next user message ("{system}\n{user}").
//
// Family renderers: each template is also matched to a known family from its
// text (the markers llama.cpp's llm_chat_detect_template looks for), else
// ChatFamily::kOther. The family decides StopTokens(), has_thinking() and
// tool_call_format() (with the template: see "Tools" below) in both modes,
// and its renderer, written here, renders
// when there is no Jinja text: a family named with FromName (dpl-run's and
// dpl-server's --chat-template), a model without tokenizer.chat_template, or
// a template minja cannot parse (FromMetadata falls back to its family). A
// Jinja template whose family supports tools but that writes none itself
// (it leaves out a sample tool given to it at load: the plain ChatML of
// Qwen2's vocabulary) hands conversations with tools, tool calls or tool
// results to the family renderer, so the model sees them in the form the
// server parses. For the families' own templates both modes render the same
// text (chat_template_test checks it byte for byte), except where noted.
// Each family's name is what FromName and --chat-template take (llama.cpp's
// names where it has one).
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
//     llama.cpp's renderer does so, and it keeps a chat's earlier turns, and
//     so its cached prefix, unchanged from one turn to the next. Mistral's
//     own v3 and v3-tekken templates put it before the LAST user message
//     instead, and that is what the jinja() mode renders for a model that
//     carries them (chat_template_test shows both).
//
//   llama2, llama2-sys, llama2-sys-bos, llama2-sys-strip (any other [INST]
//     template: Mistral 7B v0.1/v0.2, Llama 2): "[INST] " opens a turn,
//     "{user} [/INST]" closes it, "{assistant}</s>" ends it. llama2 writes
//     a system message as "{system}\n"; the -sys variants (templates with
//     "<<SYS>>") as "<<SYS>>\n{system}\n<</SYS>>\n\n"; -sys-bos (templates
//     with "bos_token + '[INST]") opens every later turn with "<s>[INST] ";
//     -sys-strip (templates with "content.strip()") trims every message.
//
//   other (ChatFamily::kOther, jinja() mode only): a template of none of
//     these families (Phi-3's "<|user|>", Gemma's "<start_of_turn>", ...):
//     no thinking switch, no tools; stops: the tokenizer's end-of-generation
//     ids and the end-of-turn texts "<|end|>" and "<end_of_turn>".
//
// BOS rule (llama.cpp's): the rendered text never starts with BOS (jinja()
// mode removes a leading bos_token the template writes, as llama.cpp does);
// the caller tokenizes it with add_bos = tokenizer.adds_bos_by_default() and
// parse_special = true, so Llama 3 and Mistral get exactly one leading BOS
// (<|begin_of_text|>, <s>) and Qwen none. EncodeChat does exactly that.
//
// Content is never markup (EncodeChat, unless content_specials): each
// control-token text in a message's content, a tool call's name, arguments
// or id, a tool result's call id or a tool is swapped for a marker before
// rendering, and the markers encoded as that text, plain. Only the control
// texts are swapped, so templates that trim, split or test content (Llama 3's
// trim, Qwen3's </think> split) see it as it is. A template that alters a
// marker (tojson of content escapes its \x1f bytes; upper() or slicing would
// change it) is caught: the conversation is rendered again unmarked, and
// unless putting the control texts back into the marked rendering gives
// exactly that text, EncodeChat fails with an InvalidArgument error saying
// so, rather than encode either text (never a forged turn, never changed
// content; content_specials, or a family renderer, avoids it).
//
// Tools (OpenAI's tools, an assistant's tool_calls, role "tool" results):
// tool_call_format() says how a template writes them and how the model
// answers a call (dpl-server parses the answer by it), per family:
//   kHermes (chatml, qwen3; both modes): Qwen2.5's / Qwen3's "# Tools"
//     section, <tool_call>{"name", "arguments"}</tool_call> blocks. The
//     family renderers write them as those templates do, and a ChatML
//     template that writes no tools hands tool conversations to them.
//   kLlama3 (llama3): Llama 3.1 / 3.2 / 3.3's own templates write the tools
//     (into the first user message, or the system message) and the calls
//     ({"name", "parameters"} JSON) and results (an "ipython" turn); the
//     model answers {"name": ..., "parameters": {...}}, maybe after
//     <|python_tag|>, and ends a call with <|eom_id|> or <|eot_id|>.
//   kMistral (mistral-v1/-v3/-v3-tekken/-v7/-v7-tekken): Mistral's own
//     templates (7B v0.3, Nemo, Large 2407/2411, Small 3.x) write
//     [AVAILABLE_TOOLS] before the last user message, [TOOL_CALLS] [{...,
//     "id"}] and [TOOL_RESULTS]; the model answers [TOOL_CALLS] and a JSON
//     array of {"name", "arguments", "id"} (or, v11 tekken, name[ARGS]{...}).
//     Their templates refuse a call id that is not 9 characters: before
//     rendering, an id that is not 9 ASCII letters and digits is replaced by
//     one that is, derived from it (an FNV-1a hash in base 62: the same
//     client id gives the same id in the call and in its result, and the
//     same prompt turn after turn, so the prompt cache holds); a call
//     without an id gets one from its place, and a result without a
//     tool_call_id the id of the call it answers (the k-th result after an
//     assistant message, its k-th call).
//   kNone: every other case, tools refused with an InvalidArgument naming
//     the reason (dpl-server: a 400).
// Llama 3 and Mistral take tools only in jinja() mode, with a template that
// writes them (the load tries a sample tool, as for ChatML): the family
// renderers (--chat-template NAME, a model without a template, a template
// minja cannot parse) and a template without tools (Llama 3.0's, Mistral
// 7B v0.1/v0.2's) refuse them. Their tools prompt differs from version to
// version (Llama 3.1's "Environment: ipython" system text and date, 3.2's
// tools in the system message or the first user message; Mistral v3's
// spaces, v7's [SYSTEM_PROMPT], v11's name[ARGS] calls), so a built-in
// renderer would write some model's prompt wrongly, and the model would not
// call as it was trained to; llama.cpp too renders tools only through the
// model's Jinja template (--jinja). --chat-template-file gives a model
// without one the right template.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
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
  // A Jinja template of no family above (jinja() mode only; FromName has
  // no such name).
  kOther,
};
// The family's name, as FromName accepts it ("chatml", "qwen3", ...;
// kOther: "other").
absl::string_view ChatFamilyName(ChatFamily family);
// Every name FromName accepts, comma-separated ("chatml, llama3, ...").
const std::string& ChatTemplateNames();

// How a template writes tools and the model answers a call (the header
// comment's "Tools").
enum class ToolCallFormat : uint8_t {
  kNone,     // no tools
  kHermes,   // <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Qwen2.5, Qwen3, Hermes)
  kLlama3,   // [<|python_tag|>]{"name": ..., "parameters": {...}} (Llama 3.1+)
  kMistral,  // [TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}] (Mistral)
};
// "none", "hermes", "llama3", "mistral".
absl::string_view ToolCallFormatName(ToolCallFormat format);
// Whether `id` is a call id Mistral's templates take: 9 ASCII letters and
// digits.
bool IsMistralCallId(absl::string_view id);

// A function call an assistant message made (OpenAI's tool_calls[i].function).
struct ToolCall {
  ToolCall() = default;
  ToolCall(std::string n, std::string args, std::string call_id = "")
      : name(std::move(n)), arguments(std::move(args)), id(std::move(call_id)) {}

  std::string name;
  // The arguments as the template writes them: a JSON object in Python's
  // json.dumps spacing (", ", ": "), as Jinja's tojson gives it.
  std::string arguments;
  std::string id;  // the client's call id (tool_calls[i].id); empty: none given
};

struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string r, std::string c, std::vector<ToolCall> calls = {})
      : role(std::move(r)), content(std::move(c)), tool_calls(std::move(calls)) {}

  std::string role;  // "system", "user", "assistant", or "tool" (a call's result)
  std::string content;
  std::vector<ToolCall> tool_calls;  // an assistant message's calls
  std::string tool_call_id;          // a tool result's call id; empty: none given
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
  // writes it). Only templates with a tool_call_format() take them
  // (supports_tools(); the header comment's "Tools"); their text, like the
  // content's, is never special tokens.
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
  // A Jinja template rendered by minja (jinja() mode), its family as Detect()
  // finds it, else kOther. bos_token, eos_token: the texts the template's
  // variables of those names hold. Error: the template does not parse
  // (minja's message, with the line and column).
  static absl::StatusOr<ChatTemplate> FromJinja(absl::string_view jinja, absl::string_view bos_token,
                                                absl::string_view eos_token);
  // override_name non-empty: FromName(override_name). Else override_jinja
  // non-empty (a --chat-template-file): FromJinja(override_jinja). Else
  // tokenizer.chat_template: FromJinja, or, where minja cannot parse it,
  // Detect(). bos/eos texts: the tokens tokenizer.ggml.bos_token_id and
  // eos_token_id name (empty when absent). A missing template is an error
  // naming the override choices.
  static absl::StatusOr<ChatTemplate> FromMetadata(const formats::Metadata& meta,
                                                   absl::string_view override_name = "",
                                                   absl::string_view override_jinja = "");

  // Whether minja renders the template (else the family's renderer).
  bool jinja() const { return jinja_ != nullptr; }
  // Which renderer renders, for dpl-run's and dpl-server's start line:
  // "jinja (minja), family qwen3" or "family chatml (built-in renderer)".
  std::string Describe() const;

  ChatFamily family() const { return family_; }
  // Whether ChatOptions::enable_thinking changes the rendering (Qwen3).
  bool has_thinking() const { return family_ == ChatFamily::kQwen3; }
  // How this template writes tools, tool calls and tool results, and so how
  // the model answers a call: kHermes for ChatML and Qwen3 (both modes:
  // Qwen2.5's and Qwen3's "# Tools" system section, <tool_call> JSON in
  // assistant turns, <tool_response> in a user turn); kLlama3 and kMistral
  // for those families' Jinja templates that write tools (jinja() mode
  // only); else kNone.
  ToolCallFormat tool_call_format() const;
  // tool_call_format() != kNone: tools, tool calls and role "tool" messages
  // are taken.
  bool supports_tools() const { return tool_call_format() != ToolCallFormat::kNone; }
  // kMistral whose template writes a call as v11's "[TOOL_CALLS]name[ARGS]
  // {...}" (found by rendering one at load) rather than as a JSON array:
  // how a forced call is then written (the server's EnforceToolChoice).
  bool mistral_args_calls() const;
  // Empty when the template inserts none.
  const std::string& default_system_prompt() const { return default_system_; }

  // The prompt text (without a leading BOS) for `messages`. The [INST]
  // families' renderers ignore add_generation_prompt (they have none).
  // Errors, in both modes: empty conversation, a role other than
  // system/user/assistant (tool, and tools or tool calls, where
  // supports_tools(); otherwise the error says why this template takes
  // none); in jinja() mode also an InvalidArgument error for what the
  // template raises (raise_exception: Llama 3.1's "only supports single
  // tool-calls at once", Mistral's alternating roles) or minja cannot
  // evaluate. kMistral: call ids made to fit first (the header's "Tools").
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                                     bool add_generation_prompt,
                                     const ChatOptions& options = {}) const;

  // Ids that end the assistant's turn: the tokenizer's end-of-generation ids
  // plus this family's end-of-turn texts found in the vocabulary
  // (ChatML, Qwen3: <|im_end|>, <|endoftext|>; Llama 3: <|eot_id|>,
  // <|eom_id|>, <|end_of_text|>; [INST] families: </s>). Sorted, unique.
  std::vector<int32_t> StopTokens(const Tokenizer& tokenizer) const;

 private:
  struct Jinja;  // minja's parsed template and what was learned of it at load
  friend absl::StatusOr<std::vector<int32_t>> EncodeChat(const Tokenizer&, const ChatTemplate&,
                                                         const std::vector<ChatMessage>&, bool,
                                                         const ChatOptions&);
  // Render with strftime_now's clock at `now` (seconds since the epoch).
  absl::StatusOr<std::string> RenderAt(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                       const ChatOptions& options, int64_t now) const;
  std::string RenderFamily(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                           const ChatOptions& options) const;
  // EncodeChat's work, with the messages' call ids already fitted.
  absl::StatusOr<std::vector<int32_t>> EncodeAt(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                                                bool add_generation_prompt, const ChatOptions& options,
                                                int64_t now) const;
  // Why tools are refused (tool_call_format() kNone), for the errors.
  std::string NoToolsReason() const;

  ChatFamily family_ = ChatFamily::kChatML;
  std::string default_system_;
  std::shared_ptr<const Jinja> jinja_;  // null: the family's renderer
};

// The text of a Jinja chat template file (--chat-template-file), checked to
// parse. Errors name the path: unreadable, empty, over 1 MiB, or minja's
// parse error.
absl::StatusOr<std::string> ReadChatTemplateFile(const std::string& path);

// dpl-run's and dpl-server's --chat-template NAME and --chat-template-file
// PATH, checked before the model loads: a known name, a file
// ReadChatTemplateFile takes, not both.
absl::Status CheckChatTemplateFlags(absl::string_view name, const std::string& file);

// Render + Encode(add_bos = adds_bos_by_default(), parse_special = true),
// with control-token texts inside message content encoded as plain text
// unless options.content_specials.
absl::StatusOr<std::vector<int32_t>> EncodeChat(const Tokenizer& tokenizer,
                                                const ChatTemplate& chat_template,
                                                const std::vector<ChatMessage>& messages,
                                                bool add_generation_prompt,
                                                const ChatOptions& options = {});

}  // namespace dpl::tokenizer
