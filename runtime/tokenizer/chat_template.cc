#include "runtime/tokenizer/chat_template.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace dpl::tokenizer {
namespace {

constexpr absl::string_view kChoices = "chatml, llama3";
constexpr absl::string_view kImStart = "<|im_start|>";
constexpr absl::string_view kStartHeader = "<|start_header_id|>";
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

}  // namespace

absl::string_view ChatFamilyName(ChatFamily family) {
  switch (family) {
    case ChatFamily::kChatML:
      return "chatml";
    case ChatFamily::kLlama3:
      return "llama3";
  }
  return "?";
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromName(absl::string_view name) {
  ChatTemplate t;
  if (name == "chatml") {
    t.family_ = ChatFamily::kChatML;
  } else if (name == "llama3") {
    t.family_ = ChatFamily::kLlama3;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown chat template \"", name, "\"; choose one of: ", kChoices));
  }
  return t;
}

absl::StatusOr<ChatTemplate> ChatTemplate::Detect(absl::string_view jinja) {
  ChatTemplate t;
  if (jinja.find(kImStart) != absl::string_view::npos) {
    t.family_ = ChatFamily::kChatML;
    t.default_system_ = FindDefaultSystemPrompt(jinja);
  } else if (jinja.find(kStartHeader) != absl::string_view::npos) {
    t.family_ = ChatFamily::kLlama3;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer.chat_template is neither ChatML (no \"", kImStart, "\") nor Llama 3 (no \"",
        kStartHeader, "\"); override it with one of: ", kChoices));
  }
  return t;
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromMetadata(const formats::Metadata& meta,
                                                        absl::string_view override_name) {
  if (!override_name.empty()) return FromName(override_name);
  constexpr absl::string_view kKey = "tokenizer.chat_template";
  if (meta.Find(kKey) == nullptr) {
    return absl::NotFoundError(absl::StrCat("the model has no ", kKey,
                                            "; choose a chat template: ", kChoices));
  }
  DPL_ASSIGN_OR_RETURN(const absl::string_view jinja, meta.GetString(kKey));
  return Detect(jinja);
}

absl::StatusOr<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                 bool add_generation_prompt) const {
  if (messages.empty()) return absl::InvalidArgumentError("chat: the conversation is empty");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant") {
      return absl::InvalidArgumentError(absl::StrCat(
          "chat: message ", i, " has role \"", role, "\"; roles are system, user, assistant"));
    }
  }
  std::string out;
  switch (family_) {
    case ChatFamily::kChatML:
      if (!default_system_.empty() && messages[0].role != "system") {
        absl::StrAppend(&out, kImStart, "system\n", default_system_, "<|im_end|>\n");
      }
      for (const ChatMessage& m : messages) {
        absl::StrAppend(&out, kImStart, m.role, "\n", m.content, "<|im_end|>\n");
      }
      if (add_generation_prompt) absl::StrAppend(&out, kImStart, "assistant\n");
      break;
    case ChatFamily::kLlama3:
      for (const ChatMessage& m : messages) {
        absl::StrAppend(&out, kStartHeader, m.role, "<|end_header_id|>\n\n",
                        TrimAsciiSpace(m.content), "<|eot_id|>");
      }
      if (add_generation_prompt) {
        absl::StrAppend(&out, kStartHeader, "assistant<|end_header_id|>\n\n");
      }
      break;
  }
  return out;
}

std::vector<int32_t> ChatTemplate::StopTokens(const Tokenizer& tokenizer) const {
  std::vector<int32_t> ids = tokenizer.end_of_generation_ids();
  std::vector<absl::string_view> texts;
  if (family_ == ChatFamily::kChatML) {
    texts = {"<|im_end|>", "<|endoftext|>"};
  } else {
    texts = {"<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"};
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
                                                bool add_generation_prompt) {
  if (!tokenizer.has_vocab()) {
    return absl::FailedPreconditionError(
        "chat needs a tokenizer vocabulary; this model has ids only");
  }
  DPL_ASSIGN_OR_RETURN(const std::string text, chat_template.Render(messages, add_generation_prompt));
  return tokenizer.Encode(text, tokenizer.adds_bos_by_default(), /*parse_special=*/true);
}

}  // namespace dpl::tokenizer
