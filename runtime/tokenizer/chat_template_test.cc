#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "runtime/tokenizer/chat_template.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tests/shared_dir.h"

namespace dpl::tokenizer {
namespace {

const std::vector<ChatMessage> kTwoTurns = {
    {"user", "Hi there!"},
    {"assistant", "Hello! How can I help?"},
    {"user", "  Tell me a joke.\n"},
};

// kTwoTurns in ChatML, then the generation prompt.
const std::string kTwoTurnsChatML =
    "<|im_start|>user\nHi there!<|im_end|>\n"
    "<|im_start|>assistant\nHello! How can I help?<|im_end|>\n"
    "<|im_start|>user\n  Tell me a joke.\n<|im_end|>\n"
    "<|im_start|>assistant\n";

// Qwen2.5-Instruct's template (the parts that matter here), as GGUF stores it:
// Jinja string literals spell newlines as "\n" escapes.
constexpr char kQwen25Template[] =
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.' }}\n    {%- endif %}\n{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. "
    "You are a helpful assistant.<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n"
    "{%- for message in messages %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + "
    "'\\n' }}\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n";

// Plain ChatML (no default system prompt).
constexpr char kChatMLTemplate[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

// Llama 3 Instruct's template.
constexpr char kLlama3Template[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

formats::Metadata LoadMetadata(const std::string& rel) {
  auto gguf = formats::GgufFile::Open(testing::SharedDir() + "/" + rel);
  REQUIRE_MESSAGE(gguf.ok(), gguf.status().ToString());
  return gguf->metadata();
}

TEST_CASE("the qwen2 vocab's own template: ChatML with its default system prompt") {
  const formats::Metadata meta = LoadMetadata("vocab/ggml-vocab-qwen2.gguf");
  auto t = ChatTemplate::FromMetadata(meta);
  REQUIRE_MESSAGE(t.ok(), t.status().ToString());
  CHECK(t->family() == ChatFamily::kChatML);
  CHECK(t->default_system_prompt() == "You are a helpful assistant");
  auto text = t->Render(kTwoTurns, /*add_generation_prompt=*/true);
  REQUIRE(text.ok());
  CHECK(*text == "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n" + kTwoTurnsChatML);
}

TEST_CASE("Qwen2.5 template: default system prompt only without a system turn") {
  auto t = ChatTemplate::Detect(kQwen25Template);
  REQUIRE(t.ok());
  CHECK(t->family() == ChatFamily::kChatML);
  CHECK(t->default_system_prompt() ==
        "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  auto text = t->Render(kTwoTurns, true);
  REQUIRE(text.ok());
  CHECK(*text ==
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\n" + kTwoTurnsChatML);

  std::vector<ChatMessage> with_system = {{"system", "Be brief."}, {"user", "Hi"}};
  auto text2 = t->Render(with_system, false);
  REQUIRE(text2.ok());
  CHECK(*text2 ==
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n");
}

TEST_CASE("plain ChatML: no system prompt inserted; same as the override") {
  auto t = ChatTemplate::Detect(kChatMLTemplate);
  REQUIRE(t.ok());
  CHECK(t->family() == ChatFamily::kChatML);
  CHECK(t->default_system_prompt().empty());
  const std::string& expect = kTwoTurnsChatML;
  auto text = t->Render(kTwoTurns, true);
  REQUIRE(text.ok());
  CHECK(*text == expect);
  auto by_name = ChatTemplate::FromName("chatml");
  REQUIRE(by_name.ok());
  CHECK(*by_name->Render(kTwoTurns, true) == expect);
  // Without the generation prompt the text ends after the last turn.
  CHECK(*t->Render(kTwoTurns, false) == expect.substr(0, expect.size() - 22));
}

TEST_CASE("Llama 3: header format, trimmed content, no BOS in the text") {
  auto t = ChatTemplate::Detect(kLlama3Template);
  REQUIRE(t.ok());
  CHECK(t->family() == ChatFamily::kLlama3);
  const std::string expect =
      "<|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nHello! How can I help?<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nTell me a joke.<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n";
  auto text = t->Render(kTwoTurns, true);
  REQUIRE(text.ok());
  CHECK(*text == expect);

  // Tokenized with the Llama 3 vocabulary: exactly one BOS, from add_bos.
  auto tok = Tokenizer::FromMetadata(LoadMetadata("vocab/ggml-vocab-llama-bpe.gguf"));
  REQUIRE(tok.ok());
  auto ids = EncodeChat(*tok, *t, kTwoTurns, true);
  REQUIRE(ids.ok());
  REQUIRE(ids->size() > 10);
  CHECK((*ids)[0] == 128000);
  CHECK(std::count(ids->begin(), ids->end(), 128000) == 1);
  CHECK((*ids)[1] == 128006);  // <|start_header_id|>
  CHECK(std::count(ids->begin(), ids->end(), 128009) == 3);  // <|eot_id|>
  CHECK(ids->back() != 128009);
  CHECK(tok->Decode(*ids) == "<|begin_of_text|>" + expect);

  const std::vector<int32_t> stops = t->StopTokens(*tok);
  CHECK(std::find(stops.begin(), stops.end(), 128009) != stops.end());
  CHECK(std::find(stops.begin(), stops.end(), 128001) != stops.end());
  CHECK(std::find(stops.begin(), stops.end(), 128006) == stops.end());
}

TEST_CASE("ChatML through the Qwen tokenizer: no BOS, stops at <|im_end|>") {
  const formats::Metadata meta = LoadMetadata("vocab/ggml-vocab-qwen2.gguf");
  auto tok = Tokenizer::FromMetadata(meta);
  REQUIRE(tok.ok());
  auto t = ChatTemplate::FromMetadata(meta);
  REQUIRE(t.ok());
  auto ids = EncodeChat(*tok, *t, {{"user", "Hi"}}, true);
  REQUIRE(ids.ok());
  CHECK((*ids)[0] == 151644);
  CHECK(std::count(ids->begin(), ids->end(), 151643) == 0);  // no BOS (= <|endoftext|>)
  CHECK(std::count(ids->begin(), ids->end(), 151644) == 3);  // system, user, assistant
  const std::vector<int32_t> stops = t->StopTokens(*tok);
  CHECK(stops == std::vector<int32_t>{151643, 151645});
}

TEST_CASE("overrides, unknown templates and bad conversations are clear errors") {
  auto llama = ChatTemplate::FromMetadata(formats::Metadata{}, "llama3");
  REQUIRE(llama.ok());
  CHECK(llama->family() == ChatFamily::kLlama3);
  CHECK(ChatFamilyName(llama->family()) == "llama3");

  auto none = ChatTemplate::FromMetadata(formats::Metadata{});
  REQUIRE(!none.ok());
  CHECK(none.status().message().find("chatml, llama3") != absl::string_view::npos);

  auto bad_name = ChatTemplate::FromName("vicuna");
  REQUIRE(!bad_name.ok());
  CHECK(bad_name.status().message().find("vicuna") != absl::string_view::npos);
  CHECK(bad_name.status().message().find("chatml, llama3") != absl::string_view::npos);

  auto unknown = ChatTemplate::Detect("{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}");
  REQUIRE(!unknown.ok());
  CHECK(unknown.status().message().find("chatml, llama3") != absl::string_view::npos);

  // The override wins over the model's own template.
  formats::Metadata meta;
  meta.Set("tokenizer.chat_template", formats::MetaValue::String(kLlama3Template));
  auto forced = ChatTemplate::FromMetadata(meta, "chatml");
  REQUIRE(forced.ok());
  CHECK(forced->family() == ChatFamily::kChatML);

  auto chatml = ChatTemplate::FromName("chatml");
  REQUIRE(chatml.ok());
  CHECK(!chatml->Render({}, true).ok());
  auto bad_role = chatml->Render({{"user", "a"}, {"robot", "b"}}, true);
  REQUIRE(!bad_role.ok());
  CHECK(bad_role.status().message().find("robot") != absl::string_view::npos);
}

}  // namespace
}  // namespace dpl::tokenizer
