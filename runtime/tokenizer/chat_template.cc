#include "runtime/tokenizer/chat_template.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <exception>
#include <fstream>
#include <iomanip>
#include <sstream>

// minja is included here only (it is large): one translation unit compiles it.
#include "minja/minja.hpp"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "runtime/tokenizer/unicode.h"

namespace dpl::tokenizer {

// What minja renders, and what the load learned of the template.
struct ChatTemplate::Jinja {
  std::string source;
  std::shared_ptr<minja::TemplateNode> root;
  std::string bos_token, eos_token;
  // It writes a system message given to it (else system messages are folded
  // into the next user message, as minja's chat-template.hpp polyfill does).
  bool system_role = true;
  // It writes the tools it is given.
  bool tools = false;
  // It writes an assistant's call as "[TOOL_CALLS]name[ARGS]{...}"
  // (Mistral's v11 tokenizers: Mistral Small 3.2, Magistral, Devstral), not
  // as [TOOL_CALLS] and a JSON array.
  bool mistral_args = false;
};

namespace {

using ojson = nlohmann::ordered_json;

// Every family once: its name (FromName, ChatFamilyName, the choices listed
// in errors and in dpl-run's --help).
struct FamilyName {
  ChatFamily family;
  absl::string_view name;
};
constexpr FamilyName kFamilies[] = {
    {ChatFamily::kChatML, "chatml"},
    {ChatFamily::kLlama3, "llama3"},
    {ChatFamily::kQwen3, "qwen3"},
    {ChatFamily::kMistralV7, "mistral-v7"},
    {ChatFamily::kMistralV7Tekken, "mistral-v7-tekken"},
    {ChatFamily::kMistralV3, "mistral-v3"},
    {ChatFamily::kMistralV3Tekken, "mistral-v3-tekken"},
    {ChatFamily::kMistralV1, "mistral-v1"},
    {ChatFamily::kLlama2, "llama2"},
    {ChatFamily::kLlama2Sys, "llama2-sys"},
    {ChatFamily::kLlama2SysBos, "llama2-sys-bos"},
    {ChatFamily::kLlama2SysStrip, "llama2-sys-strip"},
};

constexpr absl::string_view kImStart = "<|im_start|>";
constexpr absl::string_view kImEnd = "<|im_end|>";
constexpr absl::string_view kStartHeader = "<|start_header_id|>";
constexpr absl::string_view kEndHeader = "<|end_header_id|>";
constexpr absl::string_view kThinkOpen = "<think>";
constexpr absl::string_view kThinkClose = "</think>";
constexpr absl::string_view kInst = "[INST]";
constexpr absl::string_view kEndInst = "[/INST]";
constexpr absl::string_view kEos = "</s>";
constexpr absl::string_view kQwen25System =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

// A ChatML template's literal default system prompt: the text between
// "<|im_start|>system" + newline (a real one or Jinja's "\n" escape) and
// "<|im_end|>" when it is plain text inside one string literal, e.g.
//   {{ '<|im_start|>system\nYou are a helpful assistant<|im_end|>\n' }}
// Occurrences that splice in an expression (message content) are skipped.
std::string FindDefaultSystemPrompt(absl::string_view jinja) {
  constexpr absl::string_view kHead = "<|im_start|>system";
  constexpr absl::string_view kEnd = "<|im_end|>";
  for (size_t at = jinja.find(kHead); at != absl::string_view::npos;
       at = jinja.find(kHead, at + 1)) {
    absl::string_view rest = jinja.substr(at + kHead.size());
    if (rest.substr(0, 1) == "\n") {
      rest.remove_prefix(1);
    } else if (rest.substr(0, 2) == "\\n") {
      rest.remove_prefix(2);
    } else {
      continue;
    }
    const size_t end = rest.find(kEnd);
    if (end == absl::string_view::npos || end == 0) continue;
    const absl::string_view text = rest.substr(0, end);
    if (text.find_first_of("'\"{}+") != absl::string_view::npos) continue;
    return std::string(text);
  }
  // Qwen2.5 spells its prompt in a separate literal in some variants.
  if (jinja.find(kQwen25System) != absl::string_view::npos) return std::string(kQwen25System);
  return "";
}

absl::string_view TrimAsciiSpace(absl::string_view s) {
  constexpr absl::string_view kSpace = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(kSpace);
  if (b == absl::string_view::npos) return {};
  const size_t e = s.find_last_not_of(kSpace);
  return s.substr(b, e - b + 1);
}

// Python's str.lstrip("\n") / rstrip("\n") / strip("\n"), as Qwen3's
// template applies them: newlines only, not other white space.
absl::string_view LStripNewlines(absl::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}
absl::string_view RStripNewlines(absl::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

void AppendChatMLTurn(absl::string_view role, absl::string_view content, std::string* out) {
  absl::StrAppend(out, kImStart, role, "\n", content, kImEnd, "\n");
}

// Qwen2.5's and Qwen3's tools section, after the system text (Qwen2.5: the
// system message or the default, then "\n\n"; Qwen3: the system message and
// "\n\n" if there is one).
void AppendToolsSection(absl::string_view system, const std::vector<std::string>& tools,
                        std::string* out) {
  absl::StrAppend(out, kImStart, "system\n", system,
                  "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                  "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
  for (const std::string& t : tools) absl::StrAppend(out, "\n", t);
  absl::StrAppend(out,
                  "\n</tools>\n\nFor each function call, return a json object with function name and "
                  "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
                  "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
                  kImEnd, "\n");
}

// An assistant message's calls (Qwen2.5 and Qwen3 alike): each
// "<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>", the first
// after a newline when the message has text, later ones after a newline.
void AppendToolCalls(const ChatMessage& m, bool has_text, std::string* out) {
  for (size_t k = 0; k < m.tool_calls.size(); ++k) {
    if (k > 0 || has_text) absl::StrAppend(out, "\n");
    absl::StrAppend(out, "<tool_call>\n{\"name\": \"", m.tool_calls[k].name, "\", \"arguments\": ",
                    m.tool_calls[k].arguments, "}\n</tool_call>");
  }
}

// A tool result: consecutive ones share one user turn, each wrapped in
// <tool_response>.
void AppendToolResult(const std::vector<ChatMessage>& messages, size_t i, std::string* out) {
  if (i == 0 || messages[i - 1].role != "tool") absl::StrAppend(out, kImStart, "user");
  absl::StrAppend(out, "\n<tool_response>\n", messages[i].content, "\n</tool_response>");
  if (i + 1 == messages.size() || messages[i + 1].role != "tool") absl::StrAppend(out, kImEnd, "\n");
}

// ChatML as Qwen2.5's template writes it: with tools, a tools section
// (holding the first system message, or the default one) opens it; an
// assistant message with calls writes them after its text.
std::string RenderChatML(const std::vector<ChatMessage>& messages, const std::string& default_system,
                         const std::vector<std::string>& tools) {
  std::string out;
  const bool first_system = messages[0].role == "system";
  if (!tools.empty()) {
    AppendToolsSection(absl::StrCat(first_system ? messages[0].content : default_system, "\n\n"), tools,
                       &out);
  } else if (!default_system.empty() && !first_system) {
    AppendChatMLTurn("system", default_system, &out);
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (i == 0 && first_system && !tools.empty()) continue;  // in the tools section
    if (m.role == "tool") {
      AppendToolResult(messages, i, &out);
    } else if (m.role == "assistant" && !m.tool_calls.empty()) {
      absl::StrAppend(&out, kImStart, "assistant");
      if (!m.content.empty()) absl::StrAppend(&out, "\n", m.content);
      for (const ToolCall& c : m.tool_calls) {
        absl::StrAppend(&out, "\n<tool_call>\n{\"name\": \"", c.name, "\", \"arguments\": ", c.arguments,
                        "}\n</tool_call>");
      }
      absl::StrAppend(&out, kImEnd, "\n");
    } else {
      AppendChatMLTurn(m.role, m.content, &out);
    }
  }
  return out;
}

// Qwen3's template, message by message.
//   tools: a tools section opens it (holding the first system message).
//   last_query: the last user message that is not a wrapped tool result
//     ("<tool_response>...</tool_response>"); the last message if none.
//   system first: a plain ChatML turn before the loop; a later system
//     message is a plain turn where it stands.
//   assistant: with "</think>" in it, the answer is what follows the last
//     "</think>" (leading newlines dropped) and the reasoning what precedes
//     the first one (trailing newlines dropped), after its last "<think>"
//     (leading newlines dropped). After last_query, and when it is the final
//     message or has reasoning, it is written with its <think> block;
//     otherwise as its answer alone.
std::string RenderQwen3(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                        bool enable_thinking, const std::vector<std::string>& tools) {
  size_t last_query = messages.size() - 1;
  for (size_t i = messages.size(); i-- > 0;) {
    const std::string& c = messages[i].content;
    const bool tool_result =
        absl::StartsWith(c, "<tool_response>") && absl::EndsWith(c, "</tool_response>");
    if (messages[i].role == "user" && !tool_result) {
      last_query = i;
      break;
    }
  }
  std::string out;
  const bool first_system = messages[0].role == "system";
  if (!tools.empty()) {
    AppendToolsSection(first_system ? absl::StrCat(messages[0].content, "\n\n") : "", tools, &out);
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (i == 0 && first_system && !tools.empty()) continue;  // in the tools section
    if (m.role == "tool") {
      AppendToolResult(messages, i, &out);
      continue;
    }
    if (m.role != "assistant") {
      AppendChatMLTurn(m.role, m.content, &out);
      continue;
    }
    absl::string_view answer = m.content;
    absl::string_view reasoning;
    const size_t first_close = answer.find(kThinkClose);
    if (first_close != absl::string_view::npos) {
      const absl::string_view whole = m.content;
      answer = LStripNewlines(whole.substr(whole.rfind(kThinkClose) + kThinkClose.size()));
      reasoning = RStripNewlines(whole.substr(0, first_close));
      const size_t open = reasoning.rfind(kThinkOpen);
      if (open != absl::string_view::npos) reasoning.remove_prefix(open + kThinkOpen.size());
      reasoning = LStripNewlines(reasoning);
    }
    absl::StrAppend(&out, kImStart, "assistant\n");
    if (i > last_query && (i + 1 == messages.size() || !reasoning.empty())) {
      // (The template's reasoning.strip("\n") is a no-op here: both ends are
      // stripped already.)
      absl::StrAppend(&out, kThinkOpen, "\n", reasoning, "\n", kThinkClose, "\n\n",
                      LStripNewlines(answer));
    } else {
      absl::StrAppend(&out, answer);
    }
    AppendToolCalls(m, !answer.empty(), &out);
    absl::StrAppend(&out, kImEnd, "\n");
  }
  if (add_generation_prompt) {
    absl::StrAppend(&out, kImStart, "assistant\n");
    if (!enable_thinking) absl::StrAppend(&out, kThinkOpen, "\n\n", kThinkClose, "\n\n");
  }
  return out;
}

// llama.cpp's mistral-v7 and mistral-v7-tekken (no spaces).
std::string RenderMistralV7(const std::vector<ChatMessage>& messages, bool tekken) {
  const absl::string_view sp = tekken ? "" : " ";
  std::string out;
  for (const ChatMessage& m : messages) {
    if (m.role == "system") {
      absl::StrAppend(&out, "[SYSTEM_PROMPT]", sp, m.content, "[/SYSTEM_PROMPT]");
    } else if (m.role == "user") {
      absl::StrAppend(&out, kInst, sp, m.content, kEndInst);
    } else {
      absl::StrAppend(&out, sp, m.content, kEos);
    }
  }
  return out;
}

// llama.cpp's mistral-v1, mistral-v3 and mistral-v3-tekken: a turn is opened
// by the first message after the previous assistant answer, so a system
// message lands in the [INST] of the user message that follows it.
std::string RenderMistralV3(const std::vector<ChatMessage>& messages, ChatFamily family) {
  const absl::string_view lead = family == ChatFamily::kMistralV1 ? " " : "";
  const absl::string_view trail = family == ChatFamily::kMistralV3Tekken ? "" : " ";
  const bool trim_assistant = family == ChatFamily::kMistralV3;
  std::string out;
  bool in_turn = false;
  for (const ChatMessage& m : messages) {
    if (!in_turn) {
      absl::StrAppend(&out, lead, kInst, trail);
      in_turn = true;
    }
    if (m.role == "system") {
      absl::StrAppend(&out, m.content, "\n\n");
    } else if (m.role == "user") {
      absl::StrAppend(&out, m.content, lead, kEndInst);
    } else {
      absl::StrAppend(&out, trail, trim_assistant ? TrimAsciiSpace(m.content) : m.content, kEos);
      in_turn = false;
    }
  }
  return out;
}

// llama.cpp's llama2 family. The first "[INST] " is written up front (the
// BOS before it comes from the tokenizer).
std::string RenderLlama2(const std::vector<ChatMessage>& messages, ChatFamily family) {
  const bool sys_block = family != ChatFamily::kLlama2;
  const bool bos_inside = family == ChatFamily::kLlama2SysBos;
  const bool strip = family == ChatFamily::kLlama2SysStrip;
  std::string out = "[INST] ";
  bool in_turn = true;
  for (const ChatMessage& m : messages) {
    const absl::string_view content = strip ? TrimAsciiSpace(m.content) : m.content;
    if (!in_turn) {
      absl::StrAppend(&out, bos_inside ? "<s>[INST] " : "[INST] ");
      in_turn = true;
    }
    if (m.role == "system") {
      if (sys_block) {
        absl::StrAppend(&out, "<<SYS>>\n", content, "\n<</SYS>>\n\n");
      } else {
        absl::StrAppend(&out, content, "\n");
      }
    } else if (m.role == "user") {
      absl::StrAppend(&out, content, " ", kEndInst);
    } else {
      absl::StrAppend(&out, content, kEos);
      in_turn = false;
    }
  }
  return out;
}

// Mistral's call ids (the header comment's "Tools"): an id its templates
// refuse becomes 9 letters and digits, FNV-1a of the id in base 62.
std::string MistralIdFrom(absl::string_view key) {
  static constexpr char kDigits[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  uint64_t h = 14695981039346656037ull;
  for (const char c : key) {
    h ^= static_cast<uint8_t>(c);
    h *= 1099511628211ull;
  }
  std::string id(9, 'a');
  for (char& c : id) {  // 62^9 < 2^64: every digit from the hash
    c = kDigits[h % 62];
    h /= 62;
  }
  return id;
}

std::string MistralId(absl::string_view id) {
  return IsMistralCallId(id) ? std::string(id) : MistralIdFrom(absl::StrCat("id:", id));
}

// The conversation with every call id and result id one Mistral's templates
// take: a client's fitting id as it is, another one mapped (MistralId), a
// missing call id made from the call's place, a missing result id the id of
// the call it answers (the k-th result after an assistant message with
// calls answers its k-th call).
std::vector<ChatMessage> WithMistralCallIds(const std::vector<ChatMessage>& messages) {
  std::vector<ChatMessage> out = messages;
  std::vector<std::string> open;  // the last assistant message's call ids
  size_t answered = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    ChatMessage& m = out[i];
    for (size_t k = 0; k < m.tool_calls.size(); ++k) {
      std::string& id = m.tool_calls[k].id;
      id = id.empty() ? MistralIdFrom(absl::StrCat("call:", i, ":", k)) : MistralId(id);
    }
    if (m.role == "assistant" && !m.tool_calls.empty()) {
      open.clear();
      for (const ToolCall& c : m.tool_calls) open.push_back(c.id);
      answered = 0;
    } else if (m.role == "tool") {
      if (!m.tool_call_id.empty()) {
        m.tool_call_id = MistralId(m.tool_call_id);
      } else if (answered < open.size()) {
        m.tool_call_id = open[answered];
      } else {
        m.tool_call_id = MistralIdFrom(absl::StrCat("result:", i));
      }
      ++answered;
    }
  }
  return out;
}

bool IsMistralFamily(ChatFamily f) {
  return f == ChatFamily::kMistralV7 || f == ChatFamily::kMistralV7Tekken || f == ChatFamily::kMistralV3 ||
         f == ChatFamily::kMistralV3Tekken || f == ChatFamily::kMistralV1;
}

// ---- jinja() mode ----

absl::StatusOr<std::shared_ptr<minja::TemplateNode>> ParseJinja(absl::string_view text) {
  try {
    // chat-template.hpp's (and so llama.cpp's) options.
    return minja::Parser::parse(std::string(text), {/*trim_blocks=*/true, /*lstrip_blocks=*/true,
                                                    /*keep_trailing_newline=*/false});
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("the chat template does not parse: ", e.what()));
  }
}

// A call's arguments as the template sees them: the JSON object (so that
// "arguments | tojson" writes it, as llama.cpp passes it to templates that
// want an object), or the text when it is not JSON.
ojson ArgumentsJson(const std::string& arguments) {
  ojson v = ojson::parse(arguments, nullptr, /*allow_exceptions=*/false);
  return v.is_discarded() ? ojson(arguments) : v;
}

ojson MessageJson(const ChatMessage& m) {
  ojson j = {{"role", m.role}, {"content", m.content}};
  if (!m.tool_calls.empty()) {
    ojson calls = ojson::array();
    for (const ToolCall& c : m.tool_calls) {
      ojson call = {{"type", "function"},
                    {"function", {{"name", c.name}, {"arguments", ArgumentsJson(c.arguments)}}}};
      if (!c.id.empty()) call["id"] = c.id;
      calls.push_back(std::move(call));
    }
    j["tool_calls"] = std::move(calls);
  }
  if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
  return j;
}

// The messages variable. fold_system: minja's system-role polyfill (its
// chat-template.hpp, which llama.cpp applies): system texts gather, "\n"
// between them, and open the next user message ("{system}\n{user}", or the
// system text alone for an empty user message); before any other message,
// or at the end, they become a user message of their own.
ojson MessagesJson(const std::vector<ChatMessage>& messages, bool fold_system) {
  ojson out = ojson::array();
  std::string pending;
  auto flush = [&] {
    if (pending.empty()) return;
    out.push_back({{"role", "user"}, {"content", pending}});
    pending.clear();
  };
  for (const ChatMessage& m : messages) {
    if (!fold_system) {
      out.push_back(MessageJson(m));
      continue;
    }
    if (m.role == "system") {
      if (!pending.empty()) pending += "\n";
      pending += m.content;
      continue;
    }
    ojson j = MessageJson(m);
    if (m.role == "user") {
      if (!pending.empty()) {
        j["content"] = m.content.empty() ? pending : absl::StrCat(pending, "\n", m.content);
        pending.clear();
      }
    } else {
      flush();
    }
    out.push_back(std::move(j));
  }
  flush();
  return out;
}

// One render: the variables llama.cpp passes (common/chat.cpp and minja's
// chat_template::apply); a leading bos_token removed (the BOS rule).
absl::StatusOr<std::string> RenderMinja(const minja::TemplateNode& root, const std::string& bos_token,
                                        const std::string& eos_token, const ojson& messages,
                                        bool add_generation_prompt, const ojson* tools, bool enable_thinking,
                                        int64_t now) {
  try {
    ojson vars = {{"messages", messages},
                  {"add_generation_prompt", add_generation_prompt},
                  {"bos_token", bos_token},
                  {"eos_token", eos_token},
                  {"enable_thinking", enable_thinking}};
    if (tools != nullptr) vars["tools"] = *tools;
    std::shared_ptr<minja::Context> context = minja::Context::make(minja::Value(vars));
    context->set("strftime_now",
                 minja::Value::callable([now](const std::shared_ptr<minja::Context>&, minja::ArgumentsValue& args) {
                   args.expectArgs("strftime_now", {1, 1}, {0, 0});
                   const std::string format = args.args[0].get<std::string>();
                   const std::time_t t = static_cast<std::time_t>(now);
                   std::tm local{};
                   localtime_r(&t, &local);
                   std::ostringstream ss;
                   ss << std::put_time(&local, format.c_str());
                   return minja::Value(ss.str());
                 }));
    std::string out = root.render(context);
    if (!bos_token.empty() && absl::StartsWith(out, bos_token)) out.erase(0, bos_token.size());
    return out;
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("chat template: ", e.what()));
  }
}

// The token text an id key names (bos_token_id, eos_token_id); empty when
// absent.
std::string TokenTextOf(const formats::Metadata& meta, absl::string_view id_key) {
  const formats::MetaValue* id = meta.Find(id_key);
  if (id == nullptr || !id->is_integer()) return "";
  const absl::StatusOr<const formats::MetaValue*> tokens = meta.GetArray("tokenizer.ggml.tokens");
  if (!tokens.ok() || (*tokens)->elem_type != formats::GgufValueType::kString) return "";
  const int64_t i = id->AsInt();
  if (i < 0 || static_cast<uint64_t>(i) >= (*tokens)->count) return "";
  return std::string((*tokens)->StringAt(static_cast<uint64_t>(i)));
}

}  // namespace

absl::string_view ChatFamilyName(ChatFamily family) {
  for (const FamilyName& f : kFamilies) {
    if (f.family == family) return f.name;
  }
  return family == ChatFamily::kOther ? "other" : "?";
}

const std::string& ChatTemplateNames() {
  static const std::string* const names = [] {
    std::vector<absl::string_view> v;
    for (const FamilyName& f : kFamilies) v.push_back(f.name);
    return new std::string(absl::StrJoin(v, ", "));
  }();
  return *names;
}

absl::string_view ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kNone: return "none";
    case ToolCallFormat::kHermes: return "hermes";
    case ToolCallFormat::kLlama3: return "llama3";
    case ToolCallFormat::kMistral: return "mistral";
  }
  return "?";
}

bool IsMistralCallId(absl::string_view id) {
  return id.size() == 9 && std::all_of(id.begin(), id.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
         });
}

ToolCallFormat ChatTemplate::tool_call_format() const {
  if (family_ == ChatFamily::kChatML || family_ == ChatFamily::kQwen3) return ToolCallFormat::kHermes;
  // Llama 3 and Mistral: only their own Jinja templates that write tools
  // (the header comment's "Tools" says why).
  if (jinja_ == nullptr || !jinja_->tools) return ToolCallFormat::kNone;
  if (family_ == ChatFamily::kLlama3) return ToolCallFormat::kLlama3;
  if (IsMistralFamily(family_)) return ToolCallFormat::kMistral;
  return ToolCallFormat::kNone;
}

bool ChatTemplate::mistral_args_calls() const {
  return tool_call_format() == ToolCallFormat::kMistral && jinja_ != nullptr && jinja_->mistral_args;
}

std::string ChatTemplate::NoToolsReason() const {
  const absl::string_view name = ChatFamilyName(family_);
  if (family_ == ChatFamily::kLlama3 || IsMistralFamily(family_)) {
    if (jinja_ == nullptr) {
      return absl::StrCat("the built-in ", name,
                          " renderer writes no tools (its tools prompt differs from model to model): use the "
                          "model's own Jinja template (Llama 3.1+, Mistral's templates with [AVAILABLE_TOOLS]), "
                          "or give one with --chat-template-file");
    }
    return absl::StrCat("this ", name, " Jinja template writes no tools (the model's template has no tools section)");
  }
  return absl::StrCat("this template (family ", name,
                      ") has no tools; ChatML and Qwen3 templates, and Llama 3.1+ and Mistral Jinja templates "
                      "that write tools, take them");
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromName(absl::string_view name) {
  for (const FamilyName& f : kFamilies) {
    if (f.name != name) continue;
    ChatTemplate t;
    t.family_ = f.family;
    return t;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown chat template \"", name,
                                                 "\"; choose one of: ", ChatTemplateNames()));
}

absl::StatusOr<ChatTemplate> ChatTemplate::Detect(absl::string_view jinja) {
  // llama.cpp accepts a family name in place of a template.
  if (absl::StatusOr<ChatTemplate> named = FromName(jinja); named.ok()) return named;
  auto has = [jinja](absl::string_view marker) { return absl::StrContains(jinja, marker); };
  ChatTemplate t;
  if (has(kImStart)) {
    // Qwen3 tells itself apart by its thinking switch. QwQ and Qwen3-2507
    // templates handle <think> too but have no switch (QwQ also opens
    // <think> in its generation prompt): they stay plain ChatML, as in
    // llama.cpp's non-Jinja path.
    if (has(kThinkOpen) && has(kThinkClose) && has("enable_thinking")) {
      t.family_ = ChatFamily::kQwen3;
    } else {
      t.family_ = ChatFamily::kChatML;
      t.default_system_ = FindDefaultSystemPrompt(jinja);
    }
  } else if (absl::StartsWith(jinja, "mistral") || has(kInst)) {
    // llama.cpp's order of tests (llm_chat_detect_template).
    if (has("[SYSTEM_PROMPT]")) {
      t.family_ = ChatFamily::kMistralV7;
    } else if (has("' [INST] ' + system_message") || has("[AVAILABLE_TOOLS]")) {
      if (has(" [INST]")) {
        t.family_ = ChatFamily::kMistralV1;
      } else if (has("\"[INST]\"")) {
        t.family_ = ChatFamily::kMistralV3Tekken;
      } else {
        t.family_ = ChatFamily::kMistralV3;
      }
    } else if (has("content.strip()")) {
      t.family_ = ChatFamily::kLlama2SysStrip;
    } else if (has("bos_token + '[INST]")) {
      t.family_ = ChatFamily::kLlama2SysBos;
    } else if (has("<<SYS>>")) {
      t.family_ = ChatFamily::kLlama2Sys;
    } else {
      t.family_ = ChatFamily::kLlama2;
    }
  } else if (has(kStartHeader) && has(kEndHeader)) {
    t.family_ = ChatFamily::kLlama3;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer.chat_template is of no family dpl knows (it has none of \"", kImStart,
        "\", \"", kInst, "\", \"", kStartHeader,
        "\"); override it with one of: ", ChatTemplateNames()));
  }
  return t;
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromJinja(absl::string_view jinja, absl::string_view bos_token,
                                                     absl::string_view eos_token) {
  auto j = std::make_shared<Jinja>();
  j->source = std::string(jinja);
  DPL_ASSIGN_OR_RETURN(j->root, ParseJinja(jinja));
  j->bos_token = std::string(bos_token);
  j->eos_token = std::string(eos_token);
  // What the template does with a system message and with tools, tried once
  // as minja's chat-template.hpp does (a template that raises does neither).
  constexpr absl::string_view kSystemNeedle = "<System Needle>", kUserNeedle = "<User Needle>";
  const ojson user = {{"role", "user"}, {"content", kUserNeedle}};
  const absl::StatusOr<std::string> with_system =
      RenderMinja(*j->root, j->bos_token, j->eos_token,
                  ojson::array({{{"role", "system"}, {"content", kSystemNeedle}}, user}), false, nullptr, true, 0);
  j->system_role = with_system.ok() && absl::StrContains(*with_system, kSystemNeedle);
  const ojson tools = ojson::array({{{"type", "function"},
                                     {"function",
                                      {{"name", "some_tool"},
                                       {"description", "Some tool."},
                                       {"parameters", {{"type", "object"}, {"properties", ojson::object()}}}}}}});
  const absl::StatusOr<std::string> with_tools =
      RenderMinja(*j->root, j->bos_token, j->eos_token, ojson::array({user}), false, &tools, true, 0);
  j->tools = with_tools.ok() && absl::StrContains(*with_tools, "some_tool");
  // How it writes a call: a conversation with one (a Mistral-style 9-letter
  // id, which those templates insist on), as the real renders pass it.
  const std::vector<ChatMessage> called = {{"user", std::string(kUserNeedle)},
                                           {"assistant", "", {{"some_tool", "{}", "abcDEF123"}}}};
  const absl::StatusOr<std::string> with_call =
      RenderMinja(*j->root, j->bos_token, j->eos_token, MessagesJson(called, !j->system_role), false, &tools, true, 0);
  j->mistral_args = with_call.ok() && absl::StrContains(*with_call, "some_tool[ARGS]");

  ChatTemplate t;
  if (absl::StatusOr<ChatTemplate> family = Detect(jinja); family.ok()) {
    t = *std::move(family);
  } else {
    t.family_ = ChatFamily::kOther;
  }
  t.jinja_ = std::move(j);
  return t;
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromMetadata(const formats::Metadata& meta,
                                                        absl::string_view override_name,
                                                        absl::string_view override_jinja) {
  if (!override_name.empty()) return FromName(override_name);
  const std::string bos = TokenTextOf(meta, "tokenizer.ggml.bos_token_id");
  const std::string eos = TokenTextOf(meta, "tokenizer.ggml.eos_token_id");
  if (!override_jinja.empty()) return FromJinja(override_jinja, bos, eos);
  constexpr absl::string_view kKey = "tokenizer.chat_template";
  if (meta.Find(kKey) == nullptr) {
    return absl::NotFoundError(absl::StrCat("the model has no ", kKey,
                                            "; choose a chat template: ", ChatTemplateNames()));
  }
  DPL_ASSIGN_OR_RETURN(const absl::string_view jinja, meta.GetString(kKey));
  // llama.cpp accepts a family name in place of a template.
  if (absl::StatusOr<ChatTemplate> named = FromName(jinja); named.ok()) return named;
  absl::StatusOr<ChatTemplate> t = FromJinja(jinja, bos, eos);
  if (t.ok()) return t;
  // minja cannot parse it: the family's renderer, if it has a family.
  absl::StatusOr<ChatTemplate> family = Detect(jinja);
  if (family.ok()) return family;
  return absl::InvalidArgumentError(
      absl::StrCat(t.status().message(), "; and ", family.status().message()));
}

std::string ChatTemplate::Describe() const {
  if (jinja()) return absl::StrCat("jinja (minja), family ", ChatFamilyName(family_));
  return absl::StrCat("family ", ChatFamilyName(family_), " (built-in renderer)");
}

absl::StatusOr<std::string> ReadChatTemplateFile(const std::string& path) {
  constexpr std::streamoff kMaxBytes = 1 << 20;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--chat-template-file ", path, ": cannot open it (", std::strerror(errno), ")"));
  }
  std::string text;
  char buf[65536];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    text.append(buf, static_cast<size_t>(in.gcount()));
    if (static_cast<std::streamoff>(text.size()) > kMaxBytes) {
      return absl::InvalidArgumentError(absl::StrCat("--chat-template-file ", path, ": larger than 1 MiB"));
    }
  }
  if (in.bad()) {
    return absl::InvalidArgumentError(absl::StrCat("--chat-template-file ", path, ": cannot read it"));
  }
  if (text.empty()) return absl::InvalidArgumentError(absl::StrCat("--chat-template-file ", path, ": empty"));
  if (const auto parsed = ParseJinja(text); !parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--chat-template-file ", path, ": ", parsed.status().message()));
  }
  return text;
}

absl::Status CheckChatTemplateFlags(absl::string_view name, const std::string& file) {
  if (!name.empty() && !file.empty()) {
    return absl::InvalidArgumentError("--chat-template and --chat-template-file both choose the template: use one");
  }
  if (!name.empty()) DPL_RETURN_IF_ERROR(ChatTemplate::FromName(name).status());
  if (!file.empty()) DPL_RETURN_IF_ERROR(ReadChatTemplateFile(file).status());
  return absl::OkStatus();
}

absl::StatusOr<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                 bool add_generation_prompt,
                                                 const ChatOptions& options) const {
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  if (tool_call_format() == ToolCallFormat::kMistral) {
    return RenderAt(WithMistralCallIds(messages), add_generation_prompt, options, now);
  }
  return RenderAt(messages, add_generation_prompt, options, now);
}

absl::StatusOr<std::string> ChatTemplate::RenderAt(const std::vector<ChatMessage>& messages,
                                                   bool add_generation_prompt, const ChatOptions& options,
                                                   int64_t now) const {
  if (messages.empty()) return absl::InvalidArgumentError("chat: the conversation is empty");
  const bool tools = supports_tools();
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant" && !(tools && role == "tool")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chat: message ", i, " has role \"", role, "\"; roles are system, user, assistant",
          tools ? ", tool" : absl::StrCat(" (tool results need a template with tools: ", NoToolsReason(), ")")));
    }
    if (!tools && !messages[i].tool_calls.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("chat: message ", i, " has tool calls; ", NoToolsReason()));
    }
  }
  if (!tools && !options.tools.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("chat: tools are not taken: ", NoToolsReason()));
  }
  if (jinja_ != nullptr) {
    const bool tool_parts = !options.tools.empty() ||
                            std::any_of(messages.begin(), messages.end(), [](const ChatMessage& m) {
                              return m.role == "tool" || !m.tool_calls.empty();
                            });
    // A template that writes no tools leaves them to its family's renderer.
    if (!tool_parts || jinja_->tools) {
      ojson tools = ojson::array();
      for (const std::string& t : options.tools) {
        ojson v = ojson::parse(t, nullptr, /*allow_exceptions=*/false);
        if (v.is_discarded()) return absl::InvalidArgumentError(absl::StrCat("chat: a tool is not JSON: ", t));
        tools.push_back(std::move(v));
      }
      return RenderMinja(*jinja_->root, jinja_->bos_token, jinja_->eos_token,
                         MessagesJson(messages, !jinja_->system_role), add_generation_prompt,
                         options.tools.empty() ? nullptr : &tools, options.enable_thinking, now);
    }
  }
  return RenderFamily(messages, add_generation_prompt, options);
}

std::string ChatTemplate::RenderFamily(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                       const ChatOptions& options) const {
  std::string out;
  switch (family_) {
    case ChatFamily::kChatML:
      out = RenderChatML(messages, default_system_, options.tools);
      if (add_generation_prompt) absl::StrAppend(&out, kImStart, "assistant\n");
      break;
    case ChatFamily::kQwen3:
      out = RenderQwen3(messages, add_generation_prompt, options.enable_thinking, options.tools);
      break;
    case ChatFamily::kLlama3:
      for (const ChatMessage& m : messages) {
        absl::StrAppend(&out, kStartHeader, m.role, kEndHeader, "\n\n",
                        TrimAsciiSpace(m.content), "<|eot_id|>");
      }
      if (add_generation_prompt) {
        absl::StrAppend(&out, kStartHeader, "assistant", kEndHeader, "\n\n");
      }
      break;
    case ChatFamily::kMistralV7:
    case ChatFamily::kMistralV7Tekken:
      out = RenderMistralV7(messages, family_ == ChatFamily::kMistralV7Tekken);
      break;
    case ChatFamily::kMistralV3:
    case ChatFamily::kMistralV3Tekken:
    case ChatFamily::kMistralV1:
      out = RenderMistralV3(messages, family_);
      break;
    case ChatFamily::kLlama2:
    case ChatFamily::kLlama2Sys:
    case ChatFamily::kLlama2SysBos:
    case ChatFamily::kLlama2SysStrip:
      out = RenderLlama2(messages, family_);
      break;
    case ChatFamily::kOther:  // only ever jinja()
      break;
  }
  return out;
}

std::vector<int32_t> ChatTemplate::StopTokens(const Tokenizer& tokenizer) const {
  std::vector<int32_t> ids = tokenizer.end_of_generation_ids();
  std::vector<absl::string_view> texts;
  switch (family_) {
    case ChatFamily::kChatML:
    case ChatFamily::kQwen3:
      texts = {kImEnd, "<|endoftext|>"};
      break;
    case ChatFamily::kLlama3:
      texts = {"<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"};
      break;
    case ChatFamily::kMistralV7:
    case ChatFamily::kMistralV7Tekken:
    case ChatFamily::kMistralV3:
    case ChatFamily::kMistralV3Tekken:
    case ChatFamily::kMistralV1:
    case ChatFamily::kLlama2:
    case ChatFamily::kLlama2Sys:
    case ChatFamily::kLlama2SysBos:
    case ChatFamily::kLlama2SysStrip:
      texts = {kEos};
      break;
    case ChatFamily::kOther:
      texts = {"<|end|>", "<end_of_turn>"};
      break;
  }
  for (absl::string_view text : texts) {
    const int32_t id = tokenizer.FindToken(text);
    if (id != kNoToken) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

absl::StatusOr<std::vector<int32_t>> EncodeChat(const Tokenizer& tokenizer,
                                                const ChatTemplate& chat_template,
                                                const std::vector<ChatMessage>& messages,
                                                bool add_generation_prompt,
                                                const ChatOptions& options) {
  if (!tokenizer.has_vocab()) {
    return absl::FailedPreconditionError(
        "chat needs a tokenizer vocabulary; this model has ids only");
  }
  const int64_t now = static_cast<int64_t>(std::time(nullptr));  // one clock for every render
  // Mistral's call ids made to fit before anything else (they hold no
  // control texts then, and every render below sees the same ids).
  if (chat_template.tool_call_format() == ToolCallFormat::kMistral) {
    return chat_template.EncodeAt(tokenizer, WithMistralCallIds(messages), add_generation_prompt, options, now);
  }
  return chat_template.EncodeAt(tokenizer, messages, add_generation_prompt, options, now);
}

absl::StatusOr<std::vector<int32_t>> ChatTemplate::EncodeAt(const Tokenizer& tokenizer,
                                                            const std::vector<ChatMessage>& messages,
                                                            bool add_generation_prompt, const ChatOptions& options,
                                                            int64_t now) const {
  const ChatTemplate& chat_template = *this;
  if (options.content_specials) {
    DPL_ASSIGN_OR_RETURN(const std::string text,
                         chat_template.RenderAt(messages, add_generation_prompt, options, now));
    return tokenizer.Encode(text, tokenizer.adds_bos_by_default(), /*parse_special=*/true);
  }
  // Each control-token text in content is swapped for a marker, the
  // conversation rendered, and the rendering encoded piece by piece: the
  // markup between markers with its specials, each marker's text as plain
  // text. The pieces split where the specials' partition would have split
  // anyway, so content without control texts encodes exactly as before.
  // (Tools, tool calls and call ids come from the client too: their text is
  // escaped the same way.)
  std::vector<ChatMessage> escaped = messages;
  ChatOptions escaped_options = options;
  std::vector<std::string*> texts;
  for (ChatMessage& m : escaped) {
    texts.push_back(&m.content);
    texts.push_back(&m.tool_call_id);
    for (ToolCall& c : m.tool_calls) {
      texts.push_back(&c.name);
      texts.push_back(&c.arguments);
      texts.push_back(&c.id);
    }
  }
  for (std::string& t : escaped_options.tools) texts.push_back(&t);
  std::vector<std::string> literals;
  std::vector<std::vector<std::pair<size_t, size_t>>> spans(texts.size());
  for (size_t k = 0; k < texts.size(); ++k) {
    spans[k] = tokenizer.ControlTextSpans(*texts[k]);
    for (const auto& [begin, end] : spans[k]) literals.emplace_back(texts[k]->substr(begin, end - begin));
  }
  if (literals.empty()) {
    DPL_ASSIGN_OR_RETURN(const std::string text,
                         chat_template.RenderAt(messages, add_generation_prompt, options, now));
    return tokenizer.Encode(text, tokenizer.adds_bos_by_default(), /*parse_special=*/true);
  }
  // The marker: a private-use character (U+E000 on) that no text and no
  // template holds, around the literal's index: "\uE000" "3" "\uE000".
  // JSON keeps it as it is (tojson), trimming and case changes leave it.
  const std::string source = chat_template.jinja_ != nullptr ? chat_template.jinja_->source : "";
  std::string marker;
  for (uint32_t cp = 0xE000; cp <= 0xF8FF && marker.empty(); ++cp) {
    std::string m;
    AppendUtf8(cp, m);
    bool clash = absl::StrContains(source, m);
    for (const std::string* t : texts) clash = clash || absl::StrContains(*t, m);
    if (!clash) marker = std::move(m);
  }
  if (marker.empty()) {
    return absl::InvalidArgumentError("chat: the messages use every private-use character; no content marker is left");
  }
  size_t index = 0;
  for (size_t k = 0; k < texts.size(); ++k) {
    if (spans[k].empty()) continue;
    std::string* t = texts[k];
    std::string content;
    size_t at = 0;
    for (const auto& [begin, end] : spans[k]) {
      absl::StrAppend(&content, absl::string_view(*t).substr(at, begin - at), marker, index++, marker);
      at = end;
    }
    content.append(*t, at);
    *t = std::move(content);
  }
  DPL_ASSIGN_OR_RETURN(const std::string text,
                       chat_template.RenderAt(escaped, add_generation_prompt, escaped_options, now));
  // The rendering cut at the markers: markup, literal index, markup, ...
  std::vector<absl::string_view> markup;
  std::vector<size_t> which;
  bool intact = true;
  size_t at = 0;
  for (size_t hit; intact && (hit = text.find(marker, at)) != std::string::npos;) {
    markup.push_back(absl::string_view(text).substr(at, hit - at));
    const size_t digits = hit + marker.size();
    const size_t close = text.find(marker, digits);
    size_t i = 0;
    intact = close != std::string::npos && absl::SimpleAtoi(text.substr(digits, close - digits), &i) &&
             i < literals.size();
    which.push_back(i);
    at = intact ? close + marker.size() : text.size();
  }
  markup.push_back(absl::string_view(text).substr(at));
  // The template kept every marker as it was: then the literals put back give
  // the rendering of the conversation as it is.
  if (intact) {
    std::string rebuilt;
    for (size_t k = 0; k < which.size(); ++k) absl::StrAppend(&rebuilt, markup[k], literals[which[k]]);
    rebuilt.append(markup.back().data(), markup.back().size());
    DPL_ASSIGN_OR_RETURN(const std::string plain,
                         chat_template.RenderAt(messages, add_generation_prompt, options, now));
    intact = rebuilt == plain;
  }
  if (!intact) {
    return absl::InvalidArgumentError(
        "chat: the chat template changes message text that holds control-token texts (such as \"" +
        literals[0] +
        "\"), so they cannot be kept as plain text; remove them from the messages, or let them act as tokens "
        "(content_specials, dpl-server's --chat-content-specials)");
  }
  std::vector<int32_t> ids;
  auto append = [&ids](std::vector<int32_t> more) { ids.insert(ids.end(), more.begin(), more.end()); };
  if (tokenizer.adds_bos_by_default() && tokenizer.bos_id() != kNoToken) ids.push_back(tokenizer.bos_id());
  for (size_t k = 0; k < which.size(); ++k) {
    append(tokenizer.Encode(markup[k], false, /*parse_special=*/true));
    append(tokenizer.Encode(literals[which[k]], false, /*parse_special=*/false));
  }
  append(tokenizer.Encode(markup.back(), false, /*parse_special=*/true));
  return ids;
}

}  // namespace dpl::tokenizer
