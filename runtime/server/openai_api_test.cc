// The OpenAI JSON layer: requests parsed with llama-server's defaults, every
// bad field refused naming it, errors mapped to their HTTP status, responses
// and chunks in OpenAI's shape, invalid UTF-8 serialized safely.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "formats/model_file.h"
#include "runtime/grammar/matcher.h"
#include "runtime/server/openai_api.h"
#include "tests/shared_dir.h"

namespace dpl::server {
namespace {

using nlohmann::json;

std::string ErrorOf(absl::string_view body) {
  auto r = ParseChatRequest(body);
  REQUIRE(!r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}

TEST_CASE("a chat request with every field") {
  auto r = ParseChatRequest(R"({"model": "m", "messages": [
      {"role": "developer", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": null}],
    "max_tokens": 5, "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 3,
    "min_p": 0.1, "seed": 42, "stop": "x", "repeat_penalty": 1.1, "n": 1,
    "presence_penalty": 0, "stream": true, "stream_options": {"include_usage": true},
    "ignore_eos": true, "cache_prompt": false})");
  REQUIRE_MESSAGE(r.ok(), r.status().ToString());
  CHECK(r->params.model == "m");
  CHECK(!r->params.cache_prompt);
  CHECK(r->messages.size() == 3);
  CHECK(r->messages[0].role == "system");
  CHECK(r->messages[1].content == "hi there");
  CHECK(r->messages[2].content.empty());
  CHECK(r->params.max_tokens == 7);
  CHECK(r->params.sampling.temperature == doctest::Approx(0.5));
  CHECK(r->params.sampling.top_k == 3);
  CHECK(r->params.sampling.seed == 42);
  CHECK(r->params.seed_given);
  CHECK(r->params.stop == std::vector<std::string>{"x"});
  CHECK(r->params.stream);
  CHECK(r->params.include_usage);
  CHECK(r->params.ignore_eos);

  auto d = ParseChatRequest(R"({"messages": [{"role": "user", "content": "hi"}], "stop": ["a", "b"]})");
  REQUIRE(d.ok());
  CHECK(d->params.max_tokens == -1);
  CHECK(d->params.cache_prompt);  // llama-server's default
  // -1 is llama.cpp's "until the context ends"; the newer name wins.
  auto u = ParseChatRequest(R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
                                "max_completion_tokens": -1})");
  REQUIRE(u.ok());
  CHECK(u->params.max_tokens == -1);
  CHECK(d->params.sampling.temperature == doctest::Approx(0.8));  // llama-server's defaults
  CHECK(d->params.sampling.top_k == 40);
  CHECK(!d->params.seed_given);
  CHECK(!d->params.stream);
  CHECK(d->params.stop.size() == 2);
}

TEST_CASE("bad chat requests name the field") {
  CHECK(ErrorOf("{").find("not valid JSON") != std::string::npos);
  CHECK(ErrorOf("[1]").find("JSON object") != std::string::npos);
  CHECK(ErrorOf("{}").find("'messages' is required") != std::string::npos);
  CHECK(ErrorOf(R"({"messages": "hi"})").find("'messages'") != std::string::npos);
  CHECK(ErrorOf(R"({"messages": [{"content": "hi"}]})").find("messages[0].role") != std::string::npos);
  CHECK(ErrorOf(R"({"messages": [{"role": "function", "content": "x"}]})").find("messages[0].role") !=
        std::string::npos);
  CHECK(ErrorOf(R"({"messages": [{"role": "user"}]})").find("messages[0].content") != std::string::npos);
  CHECK(ErrorOf(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})")
            .find("messages[0].content") != std::string::npos);
  const std::string ok = R"("messages": [{"role": "user", "content": "hi"}])";
  auto with = [&](const std::string& field) { return ErrorOf("{" + ok + ", " + field + "}"); };
  CHECK(with(R"("temperature": "hot")").find("'temperature' must be a number") != std::string::npos);
  CHECK(with(R"("temperature": -1)").find("'temperature' must be in") != std::string::npos);
  CHECK(with(R"("top_p": 2)").find("'top_p'") != std::string::npos);
  CHECK(with(R"("top_k": 1.5)").find("'top_k' must be an integer") != std::string::npos);
  CHECK(with(R"("max_tokens": -5)").find("'max_tokens'") != std::string::npos);
  CHECK(with(R"("max_tokens": -2)").find("'max_tokens' must be in [-1,") != std::string::npos);
  CHECK(with(R"("max_tokens": "10")").find("'max_tokens'") != std::string::npos);
  CHECK(with(R"("n": 65)").find("'n' must be in [1, 64]") != std::string::npos);
  CHECK(ParseChatRequest("{" + ok + R"(, "n": 3})")->params.n == 3);
  CHECK(std::string(ParseCompletionRequest(R"({"prompt": ["a", "b", "c"], "n": 22})").status().message())
            .find("asks for 66 choices") != std::string::npos);
  CHECK(with(R"("stop": 3)").find("'stop'") != std::string::npos);
  CHECK(with(R"("stream": "yes")").find("'stream'") != std::string::npos);
  CHECK(with(R"("stream_options": {"include_usage": 1})").find("stream_options.include_usage") !=
        std::string::npos);
  CHECK(with(R"("presence_penalty": 2.5)").find("'presence_penalty' must be in [-2, 2]") != std::string::npos);
  CHECK(with(R"("frequency_penalty": "x")").find("'frequency_penalty' must be a number") != std::string::npos);
  auto pen = ParseChatRequest(R"({"messages": [{"role": "user", "content": "hi"}], "presence_penalty": 0.5,
                                  "frequency_penalty": -1})");
  REQUIRE(pen.ok());
  CHECK(pen->params.sampling.presence_penalty == 0.5f);
  CHECK(pen->params.sampling.frequency_penalty == -1.0f);
  CHECK(with(R"("model": 5)").find("'model'") != std::string::npos);
  CHECK(ParseChatRequest("{" + ok + R"(, "seed": 18446744073709551615})").ok());  // clamped
  CHECK(with(R"("seed": "x")").find("'seed'") != std::string::npos);
}

TEST_CASE("completion, tokenize and detokenize bodies") {
  auto t = ParseCompletionRequest(R"({"prompt": "once"})");
  REQUIRE(t.ok());
  REQUIRE(t->prompts.size() == 1);
  CHECK(!t->prompts[0].has_ids);
  CHECK(t->prompts[0].text == "once");
  auto ids = ParseCompletionRequest(R"({"prompt": [1, 2, 3], "max_tokens": 2})");
  REQUIRE(ids.ok());
  REQUIRE(ids->prompts.size() == 1);
  CHECK(ids->prompts[0].has_ids);
  CHECK(ids->prompts[0].ids == std::vector<int32_t>{1, 2, 3});
  CHECK(ParseCompletionRequest(R"({"prompt": ["once"]})")->prompts[0].text == "once");
  // A list of prompts: one choice each, text or ids.
  auto list = ParseCompletionRequest(R"({"prompt": ["a", "b"]})");
  REQUIRE(list.ok());
  REQUIRE(list->prompts.size() == 2);
  CHECK(list->prompts[1].text == "b");
  auto id_list = ParseCompletionRequest(R"({"prompt": [[1, 2], [3]]})");
  REQUIRE(id_list.ok());
  REQUIRE(id_list->prompts.size() == 2);
  CHECK(id_list->prompts[1].ids == std::vector<int32_t>{3});
  std::string many = R"({"prompt": [)";
  for (size_t i = 0; i <= kMaxCompletionPrompts; ++i) many += i ? ",\"x\"" : "\"x\"";
  many += "]}";
  CHECK(std::string(ParseCompletionRequest(many).status().message()).find("at most 64") != std::string::npos);
  for (const char* bad : {R"({})", R"({"prompt": 5})", R"({"prompt": []})", R"({"prompt": [1, -2]})",
                          R"({"prompt": ["a", 5]})", R"({"prompt": [[1], []]})", R"({"prompt": [[1], [-1]]})",
                          R"({"prompt": [1.5]})"}) {
    auto r = ParseCompletionRequest(bad);
    CHECK_MESSAGE(!r.ok(), bad);
    if (!r.ok()) CHECK(std::string(r.status().message()).find("'prompt'") != std::string::npos);
  }
  auto tk = ParseTokenizeRequest(R"({"content": "hi", "add_special": true})");
  REQUIRE(tk.ok());
  CHECK(tk->first == "hi");
  CHECK(tk->second);
  CHECK(!ParseTokenizeRequest(R"({"content": 1})").ok());
  CHECK(*ParseDetokenizeRequest(R"({"tokens": [4, 5]})") == std::vector<int32_t>{4, 5});
  CHECK(!ParseDetokenizeRequest(R"({"tokens": ["a"]})").ok());
  CHECK(!ParseDetokenizeRequest(R"({"tokens": 4})").ok());
}

TEST_CASE("errors, responses and chunks in OpenAI's shape") {
  CHECK(HttpStatus(absl::InvalidArgumentError("x")) == 400);
  CHECK(HttpStatus(absl::OutOfRangeError("x")) == 400);
  CHECK(HttpStatus(absl::UnauthenticatedError("x")) == 401);
  CHECK(HttpStatus(absl::NotFoundError("x")) == 404);
  CHECK(HttpStatus(absl::ResourceExhaustedError("x")) == 503);
  CHECK(HttpStatus(absl::UnavailableError("x")) == 503);
  CHECK(HttpStatus(absl::InternalError("x")) == 500);
  const json e = ErrorJson(absl::NotFoundError("no such model"));
  CHECK(e["error"]["message"] == "no such model");
  CHECK(e["error"]["code"] == 404);
  CHECK(e["error"]["type"] == "not_found_error");

  const ResponseHead head{"chatcmpl-1", 1700000000, "tiny"};
  const json c = ChatCompletionJson(head, {{"hello", FinishReason::kLength}}, 3, 2);
  CHECK(c["object"] == "chat.completion");
  CHECK(c["choices"][0]["message"]["role"] == "assistant");
  CHECK(c["choices"][0]["message"]["content"] == "hello");
  CHECK(c["choices"][0]["finish_reason"] == "length");
  CHECK(c["usage"]["total_tokens"] == 5);
  CHECK(c["usage"]["prompt_tokens_details"]["cached_tokens"] == 0);
  CHECK(ChatCompletionJson(head, {{"x", FinishReason::kStop}}, 30, 2, 29)["usage"]["prompt_tokens_details"]
                          ["cached_tokens"] == 29);
  CHECK(UsageChunkJson(head, false, 30, 2, 12)["usage"]["prompt_tokens_details"]["cached_tokens"] == 12);
  const json first = ChatChunkJson(head, 0, true, "", nullptr);
  CHECK(first["choices"][0]["delta"]["role"] == "assistant");
  CHECK(first["choices"][0]["finish_reason"].is_null());
  const FinishReason stop = FinishReason::kStop;
  const json last = ChatChunkJson(head, 2, false, "", &stop);
  CHECK(last["choices"][0]["finish_reason"] == "stop");
  CHECK(last["choices"][0]["index"] == 2);
  CHECK(last["choices"][0]["delta"].empty());
  const json chat_two = ChatCompletionJson(head, {{"a", stop}, {"b", stop}}, 3, 4);
  CHECK(chat_two["choices"][1]["message"]["content"] == "b");
  CHECK(chat_two["choices"][1]["index"] == 1);
  CHECK(UsageChunkJson(head, true, 1, 2)["choices"].empty());
  CHECK(CompletionJson(head, {{"t", stop}}, 1, 1)["choices"][0]["text"] == "t");
  const json two = CompletionJson(head, {{"a", stop}, {"b", FinishReason::kLength}}, 4, 3);
  CHECK(two["choices"][1]["index"] == 1);
  CHECK(two["choices"][1]["text"] == "b");
  CHECK(two["choices"][1]["finish_reason"] == "length");
  CHECK(two["usage"]["total_tokens"] == 7);
  CHECK(CompletionChunkJson(head, 3, "x", nullptr)["choices"][0]["index"] == 3);
  // Invalid UTF-8 from the model is replaced, never thrown on.
  CHECK(Dump(json{{"s", std::string("a\xff\xc3")}}) == "{\"s\":\"a\xef\xbf\xbd\xef\xbf\xbd\"}");
}

// Issue 28: bodies that made the parser build huge trees, or threw an
// uncaught out_of_range (a 500), are 400s naming the limit.
// Tool calling (issue 32): tools keep the client's key order and reach the
// template in Python's json.dumps spacing; tool_choice "none" drops them, a
// named choice keeps that one; tool results and an assistant's calls are
// messages; an answer's <tool_call> blocks become tool_calls.
TEST_CASE("tools, tool_choice, tool messages and tool calls") {
  auto r = ParseChatRequest(R"({"messages": [
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\",\"unit\":\"c\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "21"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}}}, "description": "Weather now"}},
      {"type": "function", "function": {"name": "get_time"}}],
    "parallel_tool_calls": true})");
  REQUIRE_MESSAGE(r.ok(), r.status().ToString());
  REQUIRE(r->tools.size() == 2);
  CHECK(r->tools[0] ==
        R"({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", )"
        R"("properties": {"city": {"type": "string"}}}, "description": "Weather now"}})");
  CHECK(r->params.parse_tool_calls);
  REQUIRE(r->messages.size() == 3);
  REQUIRE(r->messages[1].tool_calls.size() == 1);
  CHECK(r->messages[1].tool_calls[0].name == "get_weather");
  CHECK(r->messages[1].tool_calls[0].arguments == R"({"city": "Paris", "unit": "c"})");
  CHECK(r->messages[1].tool_calls[0].id == "call_1");  // for templates that write ids
  CHECK(r->messages[2].role == "tool");
  CHECK(r->messages[2].content == "21");
  CHECK(r->messages[2].tool_call_id == "call_1");
  CHECK(r->messages[0].tool_call_id.empty());

  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "a"}},
                                         {"type": "function", "function": {"name": "b"}}])";
  auto none = ParseChatRequest(R"({"messages": [{"role": "user", "content": "x"}], )" + tools +
                               R"(, "tool_choice": "none"})");
  REQUIRE(none.ok());
  CHECK(none->tools.empty());
  CHECK(!none->params.parse_tool_calls);
  auto named = ParseChatRequest(R"({"messages": [{"role": "user", "content": "x"}], )" + tools +
                                R"(, "tool_choice": {"type": "function", "function": {"name": "b"}}})");
  REQUIRE(named.ok());
  CHECK(named->tools == std::vector<std::string>{R"({"type": "function", "function": {"name": "b"}})"});
  auto unknown = ParseChatRequest(R"({"messages": [{"role": "user", "content": "x"}], )" + tools +
                                  R"(, "tool_choice": {"type": "function", "function": {"name": "c"}}})");
  REQUIRE(!unknown.ok());
  CHECK(unknown.status().message().find("'tool_choice'") != absl::string_view::npos);
  CHECK(!ParseChatRequest(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "x"}]})").ok());
  CHECK(!ParseChatRequest(R"({"messages": [{"role": "tool"}]})").ok());  // a result needs content
  // A duplicated key: the last one, in both parses (no index past the array).
  auto dup = ParseChatRequest(R"({"messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "b"}}],
      "tools": [{"type": "function", "function": {"name": "c"}}]})");
  REQUIRE_MESSAGE(dup.ok(), dup.status().ToString());
  CHECK(dup->tools == std::vector<std::string>{R"({"type": "function", "function": {"name": "c"}})"});
  CHECK(PythonJson(nlohmann::ordered_json::parse(R"({"b": [1, 2.5, "é\n"], "a": null})")) ==
        "{\"b\": [1, 2.5, \"é\\n\"], \"a\": null}");

  // Answers.
  ParsedAnswer a = ParseToolCalls(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>");
  REQUIRE(a.calls.size() == 2);
  CHECK(a.calls[0].name == "get_weather");
  CHECK(a.calls[0].arguments == R"({"city":"Paris"})");
  CHECK(a.calls[1].arguments == "{}");
  CHECK(a.content == "Let me check.");
  CHECK(ParseToolCalls("no calls here").calls.empty());
  CHECK(ParseToolCalls("<tool_call>{\"name\": \"x\"").content == "<tool_call>{\"name\": \"x\"");  // cut off
  CHECK(ParseToolCalls("<tool_call>not json</tool_call>").calls.empty());

  const ResponseHead head{"chatcmpl-1", 1700000000, "m"};
  CompletionChoice c{"", FinishReason::kToolCalls, a.calls};
  const json whole = ChatCompletionJson(head, {c}, 10, 5);
  CHECK(whole["choices"][0]["finish_reason"] == "tool_calls");
  CHECK(whole["choices"][0]["message"]["content"].is_null());
  const json& calls = whole["choices"][0]["message"]["tool_calls"];
  REQUIRE(calls.size() == 2);
  CHECK(calls[0]["type"] == "function");
  CHECK(calls[0]["function"]["name"] == "get_weather");
  CHECK(calls[0]["function"]["arguments"] == R"({"city":"Paris"})");
  CHECK(calls[0]["id"].get<std::string>().rfind("call_", 0) == 0);
  CHECK(calls[0]["id"] != calls[1]["id"]);
  const json chunk = ToolCallsChunkJson(head, 0, a.calls);
  CHECK(chunk["object"] == "chat.completion.chunk");
  CHECK(chunk["choices"][0]["delta"]["tool_calls"][1]["index"] == 1);
  CHECK(chunk["choices"][0]["delta"]["tool_calls"][1]["function"]["name"] == "get_time");
}

// The Responses API's tools are flat and its calls are items: tools become
// the template's chat form, function_call items join the assistant message
// before them, function_call_output items are tool results; an answer's
// calls are function_call items after the message.
TEST_CASE("/v1/responses: function tools, call items, and calls in the answer") {
  auto r = ParseResponsesRequest(R"({"input": [
      {"role": "user", "content": "Weather?"},
      {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "21"}],
    "tools": [{"type": "function", "name": "get_weather", "description": "Now", "parameters": {"type": "object"},
               "strict": true}],
    "tool_choice": {"type": "function", "name": "get_weather"}})");
  REQUIRE_MESSAGE(r.ok(), r.status().ToString());
  REQUIRE(r->tools.size() == 1);
  CHECK(r->tools[0] ==
        R"({"type": "function", "function": {"name": "get_weather", "description": "Now", "parameters": {"type": "object"}}})");
  CHECK(r->params.parse_tool_calls);
  REQUIRE(r->messages.size() == 3);
  CHECK(r->messages[1].role == "assistant");
  REQUIRE(r->messages[1].tool_calls.size() == 1);
  CHECK(r->messages[1].tool_calls[0].arguments == R"({"city": "Paris"})");
  CHECK(r->messages[1].tool_calls[0].id == "call_1");
  CHECK(r->messages[2].role == "tool");
  CHECK(r->messages[2].tool_call_id == "call_1");
  CHECK(!ParseResponsesRequest(R"({"input": "x", "tools": [{"type": "web_search"}]})").ok());
  CHECK(!ParseResponsesRequest(R"({"input": "x", "tools": [{"type": "function", "name": "a"}],
                                   "tool_choice": {"type": "function", "name": "b"}})").ok());
  CHECK(!ParseResponsesRequest(R"({"input": [{"type": "function_call_output", "output": 3}]})").ok());

  ResponsesEvents ev({"resp_abc", 1700000000, "m"});
  const std::vector<ParsedToolCall> calls = {{"get_weather", R"({"city":"Paris"})"}};
  ev.SetCalls(calls, /*with_message=*/false);
  const nlohmann::json whole = ev.Response("", FinishReason::kStop, 3, 2);
  REQUIRE(whole["output"].size() == 1);
  CHECK(whole["output"][0]["type"] == "function_call");
  CHECK(whole["output"][0]["name"] == "get_weather");
  CHECK(whole["output"][0]["arguments"] == R"({"city":"Paris"})");
  CHECK(whole["output"][0]["id"].get<std::string>().rfind("fc_", 0) == 0);
  CHECK(whole["output"][0]["call_id"].get<std::string>().rfind("call_", 0) == 0);
  ResponsesEvents st({"resp_def", 1700000000, "m"});
  std::vector<nlohmann::json> events = st.Open();
  st.SetCalls(calls, /*with_message=*/true);
  for (auto& j : st.Close("Checking.", FinishReason::kStop, 3, 2)) events.push_back(j);
  std::vector<std::string> types;
  for (const auto& j : events) types.push_back(j["type"]);
  const std::vector<std::string> tail(types.end() - 5, types.end());
  CHECK(tail == std::vector<std::string>{"response.output_item.added", "response.function_call_arguments.delta",
                                         "response.function_call_arguments.done", "response.output_item.done",
                                         "response.completed"});
  CHECK(events.back()["response"]["output"].size() == 2);
  CHECK(events.back()["response"]["output"][1]["type"] == "function_call");
}

// A streamed answer with tools: text goes out up to a "<tool_call>" (a tail
// that may begin one waits), the rest is parsed at the end.
TEST_CASE("ToolCallHoldback") {
  ToolCallHoldback h;
  CHECK(h.Push("Sure, ") == "Sure, ");
  CHECK(h.Push("let me <tool") == "let me ");
  CHECK(h.Push("_call>\n{\"name\": \"f\", \"arguments\": {}}") == "");
  CHECK(h.Push("\n</tool_call>") == "");
  const ParsedAnswer a = h.Finish();
  REQUIRE(a.calls.size() == 1);
  CHECK(a.calls[0].name == "f");
  CHECK(a.content.empty());
  ToolCallHoldback plain;
  CHECK(plain.Push("a <b> c <") == "a <b> c ");
  CHECK(plain.Finish().content == "<");  // no call: what was held is text
}

TEST_CASE("JSON depth, value count and out-of-range numbers are 400s") {
  const std::string deep = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  CHECK(ParseDetokenizeRequest("{\"tokens\":" + deep + "}").status().message().find("deeper than 64") !=
        absl::string_view::npos);
  CHECK(ParseDetokenizeRequest(std::string(1 << 20, '[')).status().message().find("deeper than 64") !=
        absl::string_view::npos);
  // At the depth limit it parses (and fails on the field instead).
  const std::string ok_deep = std::string(kMaxJsonDepth - 1, '[') + std::string(kMaxJsonDepth - 1, ']');
  CHECK(ParseDetokenizeRequest("{\"tokens\":" + ok_deep + "}").status().message().find("'tokens'") !=
        absl::string_view::npos);
  std::string wide = "{\"tokens\":[0";
  for (size_t i = 0; i < kMaxJsonValues; ++i) wide += ",0";
  wide += "]}";
  const absl::Status too_many = ParseDetokenizeRequest(wide).status();
  CHECK(too_many.code() == absl::StatusCode::kInvalidArgument);
  CHECK(too_many.message().find("more than 1048576 JSON values") != absl::string_view::npos);
  wide.resize(wide.size() - 6);  // two values fewer: the limit holds the object and the array too
  CHECK(ParseDetokenizeRequest(wide + "]}").ok());
  for (const char* body : {R"({"content": 1e400})", R"({"content": "x", "add_special": -1e400})"}) {
    const absl::Status st = ParseTokenizeRequest(body).status();
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK(HttpStatus(st) == 400);
  }
  CHECK(ErrorJson(431, "too big")["error"]["type"] == "invalid_request_error");
  CHECK(ErrorJson(431, "too big")["error"]["code"] == 431);
  CHECK(ErrorJson(503, "busy")["error"]["type"] == "unavailable_error");
}

// The Responses API: input as a string or messages (text parts), instructions
// first, max_output_tokens; other items named in the error.
TEST_CASE("/v1/responses: requests parse into messages; the answer and its events") {
  auto r = ParseResponsesRequest(R"({"model": "x", "input": "Hi", "instructions": "Be brief",
                                     "max_output_tokens": 9, "temperature": 0})");
  REQUIRE(r.ok());
  REQUIRE(r->messages.size() == 2);
  CHECK(r->messages[0].role == "system");
  CHECK(r->messages[0].content == "Be brief");
  CHECK(r->messages[1].role == "user");
  CHECK(r->messages[1].content == "Hi");
  CHECK(r->params.max_tokens == 9);
  CHECK(r->params.sampling.temperature == 0);
  auto a = ParseResponsesRequest(R"({"input": [
      {"role": "developer", "content": "sys"},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
      {"role": "assistant", "content": [{"type": "output_text", "text": "c"}]}]})");
  REQUIRE(a.ok());
  REQUIRE(a->messages.size() == 3);
  CHECK(a->messages[0].role == "system");
  CHECK(a->messages[1].content == "ab");
  CHECK(a->messages[2].role == "assistant");
  CHECK(a->params.max_tokens == -1);
  auto err = [](const char* body) { return std::string(ParseResponsesRequest(body).status().message()); };
  CHECK(err("{}").find("'input' is required") != std::string::npos);
  CHECK(err(R"({"input": []})").find("'input'") != std::string::npos);
  CHECK(err(R"({"input": [{"type": "reasoning", "summary": []}]})").find("input[0].type") != std::string::npos);
  CHECK(err(R"({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]})")
            .find("input[0].content") != std::string::npos);
  CHECK(err(R"({"input": "x", "max_output_tokens": -3})").find("'max_output_tokens'") != std::string::npos);
  CHECK(err(R"({"input": "x", "instructions": 3})").find("'instructions'") != std::string::npos);
  CHECK(err(R"({"input": "x", "n": 2})").find("'n' is not a Responses API field") != std::string::npos);

  ResponsesEvents ev({"resp_abc", 1700000000, "m.gguf"});
  const nlohmann::json whole = ev.Response("hello", FinishReason::kStop, 3, 2);
  CHECK(whole["object"] == "response");
  CHECK(whole["status"] == "completed");
  CHECK(whole["output"][0]["type"] == "message");
  CHECK(whole["output"][0]["id"] == "msg_abc");
  CHECK(whole["output"][0]["content"][0]["type"] == "output_text");
  CHECK(whole["output"][0]["content"][0]["text"] == "hello");
  CHECK(whole["usage"]["total_tokens"] == 5);
  CHECK(whole["usage"]["input_tokens_details"]["cached_tokens"] == 0);
  CHECK(ev.Response("hello", FinishReason::kStop, 3, 2, 2)["usage"]["input_tokens_details"]["cached_tokens"] == 2);
  const nlohmann::json cut = ev.Response("he", FinishReason::kLength, 3, 1);
  CHECK(cut["status"] == "incomplete");
  CHECK(cut["incomplete_details"]["reason"] == "max_output_tokens");
  std::vector<nlohmann::json> all = ev.Open();
  all.push_back(ev.Delta("hel"));
  all.push_back(ev.Delta("lo"));
  for (auto& j : ev.Close("hello", FinishReason::kStop, 3, 2)) all.push_back(j);
  const std::vector<std::string> types = {
      "response.created",           "response.in_progress",      "response.output_item.added",
      "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
      "response.output_text.done",  "response.content_part.done", "response.output_item.done",
      "response.completed"};
  REQUIRE(all.size() == types.size());
  for (size_t i = 0; i < all.size(); ++i) {
    CHECK(all[i]["type"] == types[i]);
    CHECK(all[i]["sequence_number"] == static_cast<int>(i));
  }
  CHECK(all[0]["response"]["status"] == "in_progress");
  CHECK(all[4]["delta"] == "hel");
  CHECK(all[6]["text"] == "hello");
  CHECK(all[9]["response"]["output"][0]["content"][0]["text"] == "hello");
}

// ---- Llama 3.x and Mistral tool calls (issue 32) ----

using tokenizer::ToolCallFormat;

bool Alnum9(const std::string& id) {
  return id.size() == 9 &&
         std::all_of(id.begin(), id.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)); });
}

std::string NoSpace(std::string s) {
  s.erase(std::remove_if(s.begin(), s.end(), [](char c) { return std::isspace(static_cast<unsigned char>(c)); }),
          s.end());
  return s;
}

TEST_CASE("Llama 3.x tool calls: JSON objects at a line's start or after <|python_tag|>") {
  const ToolCallFormat f = ToolCallFormat::kLlama3;
  ParsedAnswer one = ParseToolCalls(R"({"name": "get_weather", "parameters": {"city": "Paris"}})", f);
  REQUIRE(one.calls.size() == 1);
  CHECK(one.calls[0].name == "get_weather");
  CHECK(one.calls[0].arguments == R"({"city":"Paris"})");
  CHECK(one.calls[0].id.empty());  // made up in the response
  CHECK(one.content.empty());
  // <|python_tag|> before it, "arguments" for "parameters", "type".
  ParsedAnswer tagged =
      ParseToolCalls(R"(<|python_tag|>{"type": "function", "name": "f", "arguments": {"x": [1, {"y": "}"}]}})", f);
  REQUIRE(tagged.calls.size() == 1);
  CHECK(tagged.calls[0].name == "f");
  CHECK(tagged.calls[0].arguments == R"({"x":[1,{"y":"}"}]})");
  CHECK(tagged.content.empty());
  // Several: ";" or new lines between them; text before them.
  ParsedAnswer several = ParseToolCalls(
      "Let me check both.\n{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"y\": 2}}\n"
      "{\"name\": \"c\", \"parameters\": {}}",
      f);
  REQUIRE(several.calls.size() == 3);
  CHECK(several.calls[0].name == "a");
  CHECK(several.calls[0].arguments == "{}");
  CHECK(several.calls[1].arguments == R"({"y":2})");
  CHECK(several.calls[2].name == "c");
  CHECK(several.content == "Let me check both.");
  // Arguments as a string holding the object.
  ParsedAnswer str = ParseToolCalls(R"({"name": "f", "parameters": "{\"x\": 1}"})", f);
  REQUIRE(str.calls.size() == 1);
  CHECK(str.calls[0].arguments == R"({"x":1})");
  // A JSON object that is no call stays text; a call after it is found.
  ParsedAnswer after = ParseToolCalls("{\"a\": 1}\n{\"name\": \"f\", \"parameters\": {}}", f);
  REQUIRE(after.calls.size() == 1);
  CHECK(after.content == "{\"a\": 1}");
  // Not calls: the answer as it was.
  for (const std::string text : {
           std::string(R"({"name": "f", "parameters": {"x": }})"),       // malformed JSON
           std::string(R"({"name": "f", "parameters": {"x": 1})"),       // cut off
           std::string(R"({"name": "f", "parameters": "not json"})"),    // arguments not an object
           std::string(R"({"name": "f", "parameters": [1]})"),
           std::string(R"({"name": "Bob", "age": 3})"),                  // no parameters
           std::string(R"({"name": "f", "parameters": {}, "extra": 1})"),
           std::string(R"({"name": "f", "parameters": {}, "type": "tool"})"),
           std::string(R"({"name": "", "parameters": {}})"),
           std::string(R"({"name": 3, "parameters": {}})"),
           std::string(R"(The call: {"name": "f", "parameters": {}})"),  // not at a line's start
           std::string(R"(<|python_tag|>brave_search.call(query="weather in Paris"))"),  // a built-in tool
           std::string(R"(<|python_tag|>)"),
           std::string(R"({"name": "f", "parameters": {}]})"),
           std::string("{}{}{[}"),
           std::string(200000, '{'),  // deeper than any call: text, no recursion
           std::string(200000, '[') + "<|python_tag|>",
       }) {
    CAPTURE(text.substr(0, 80));
    const ParsedAnswer a = ParseToolCalls(text, f);
    CHECK(a.calls.empty());
    CHECK(a.content == text);
  }
  // The formats are the template's: Qwen's blocks are not Llama's calls, nor
  // the other way round.
  CHECK(ParseToolCalls("<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>", f).calls.empty());
  CHECK(ParseToolCalls(R"({"name": "f", "parameters": {}})").calls.empty());
}

TEST_CASE("Mistral tool calls: [TOOL_CALLS] and a JSON array, or name[ARGS]{...}") {
  const ToolCallFormat f = ToolCallFormat::kMistral;
  ParsedAnswer one = ParseToolCalls(
      R"([TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "aB3dE5gH9"}])", f);
  REQUIRE(one.calls.size() == 1);
  CHECK(one.calls[0].name == "get_weather");
  CHECK(one.calls[0].arguments == R"({"city":"Paris"})");
  CHECK(one.calls[0].id == "aB3dE5gH9");  // the model's id, kept
  CHECK(one.content.empty());
  // Several, text before, v7's space, ids missing or not fitting (made up,
  // 9 letters and digits each), arguments as a string.
  ParsedAnswer several = ParseToolCalls(
      "Checking both. [TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}, \"id\": \"call_1\"}, "
      "{\"name\": \"b\", \"arguments\": \"{\\\"x\\\": 1}\"}, {\"name\": \"c\"}]",
      f);
  REQUIRE(several.calls.size() == 3);
  CHECK(several.content == "Checking both.");
  CHECK(several.calls[1].arguments == R"({"x":1})");
  CHECK(several.calls[2].arguments == "{}");
  for (const ParsedToolCall& c : several.calls) CHECK(Alnum9(c.id));
  CHECK(several.calls[0].id != several.calls[1].id);
  // One object instead of an array.
  CHECK(ParseToolCalls(R"([TOOL_CALLS]{"name": "f", "arguments": {}})", f).calls.size() == 1);
  // v11 tekken: name[ARGS]{...}, one marker a call; [CALL_ID] in later ones.
  ParsedAnswer tekken =
      ParseToolCalls("[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[CALL_ID]aB3dE5gH9"
                     "[ARGS]{}",
                     f);
  REQUIRE(tekken.calls.size() == 2);
  CHECK(tekken.calls[0].name == "get_weather");
  CHECK(tekken.calls[0].arguments == R"({"city":"Paris"})");
  CHECK(Alnum9(tekken.calls[0].id));
  CHECK(tekken.calls[1].name == "get_time");
  CHECK(tekken.calls[1].id == "aB3dE5gH9");
  CHECK(tekken.content.empty());
  // A good block, then a bad one: the calls so far, the rest text.
  ParsedAnswer partial = ParseToolCalls("[TOOL_CALLS]a[ARGS]{}[TOOL_CALLS]b[ARGS]{", f);
  REQUIRE(partial.calls.size() == 1);
  CHECK(partial.content == "[TOOL_CALLS]b[ARGS]{");
  for (const std::string text : {
           std::string(R"([TOOL_CALLS][{"name": "f", "arguments": {]})"),  // malformed JSON
           std::string(R"([TOOL_CALLS][{"name": "f", "arguments": {}})"),  // cut off
           std::string(R"([TOOL_CALLS][{"arguments": {}}])"),              // no name
           std::string(R"([TOOL_CALLS][{"name": "f", "arguments": 3}])"),
           std::string(R"([TOOL_CALLS][{"name": "f"}, 3])"),
           std::string(R"([TOOL_CALLS][])"),
           std::string("[TOOL_CALLS]not json"),
           std::string("[TOOL_CALLS]f[ARGS]not json"),
           std::string("[TOOL_CALLS]f[ARGS][1]"),
           std::string("[TOOL_CALLS]"),
           std::string("[TOOL_CALLS]") + std::string(100000, '['),
           std::string("no calls [TOOL_CALL] here"),
       }) {
    CAPTURE(text.substr(0, 80));
    const ParsedAnswer a = ParseToolCalls(text, f);
    CHECK(a.calls.empty());
    CHECK(a.content == text);
  }

  // The model's ids are the response's (its next turn sends them back, and
  // the template takes only such ids).
  const ResponseHead head{"chatcmpl-1", 1700000000, "m"};
  const json whole = ChatCompletionJson(head, {{"", FinishReason::kToolCalls, one.calls}}, 10, 5);
  CHECK(whole["choices"][0]["message"]["tool_calls"][0]["id"] == "aB3dE5gH9");
  CHECK(ToolCallsChunkJson(head, 0, one.calls)["choices"][0]["delta"]["tool_calls"][0]["id"] == "aB3dE5gH9");
  ResponsesEvents ev({"resp_abc", 1700000000, "m"});
  ev.SetCalls(one.calls, /*with_message=*/false);
  const json r = ev.Response("", FinishReason::kStop, 3, 2);
  CHECK(r["output"][0]["call_id"] == "aB3dE5gH9");
  CHECK(r["output"][0]["id"] == "fc_aB3dE5gH9");
}

// Streams the answer in the given pieces; the streamed text, then Finish.
struct Streamed {
  std::string text;
  ParsedAnswer finish;
};
Streamed StreamIn(ToolCallFormat f, const std::vector<std::string>& pieces) {
  ToolCallHoldback h(f);
  Streamed s;
  for (const std::string& p : pieces) s.text += h.Push(p);
  s.finish = h.Finish();
  return s;
}

TEST_CASE("ToolCallHoldback: Mistral's and Llama's calls held, split markers, text streamed") {
  const ToolCallFormat llama = ToolCallFormat::kLlama3, mistral = ToolCallFormat::kMistral;
  {
    ToolCallHoldback h(mistral);
    CHECK(h.Push("Sure, ") == "Sure, ");
    CHECK(h.Push("let me [TOOL") == "let me ");
    CHECK(h.Push("_CALLS][{\"name\": \"f\", ") == "");
    CHECK(h.Push("\"arguments\": {}, \"id\": \"aB3dE5gH9\"}]") == "");
    const ParsedAnswer a = h.Finish();
    REQUIRE(a.calls.size() == 1);
    CHECK(a.calls[0].id == "aB3dE5gH9");
    CHECK(a.content.empty());
  }
  {
    ToolCallHoldback h(mistral);
    CHECK(h.Push("a [b] [TOO") == "a [b] ");
    CHECK(h.Push("K") == "[TOOK");
    CHECK(h.Push(" [") == " ");
    CHECK(h.Finish().content == "[");
  }
  {
    ToolCallHoldback h(llama);
    CHECK(h.Push("Let me check.\n") == "Let me check.\n");
    CHECK(h.Push("  {\"na") == "  ");
    CHECK(h.Push("me\": \"f\", \"parameters\": {}}") == "");
    CHECK(h.Push(" and more") == "");  // after a call: held to the end
    const ParsedAnswer a = h.Finish();
    REQUIRE(a.calls.size() == 1);
    CHECK(a.calls[0].name == "f");
    CHECK(a.content == "and more");
  }
  {
    ToolCallHoldback h(llama);
    CHECK(h.Push("<|pyth") == "");
    CHECK(h.Push("on_tag|>") == "");
    CHECK(h.Push("{\"name\": \"f\", \"parameters\": {\"x\": 1}}") == "");
    const ParsedAnswer a = h.Finish();
    REQUIRE(a.calls.size() == 1);
    CHECK(a.calls[0].arguments == R"({"x":1})");
  }
  {
    // JSON that is no call, a brace inside a line, a built-in tool call:
    // held only until they prove text.
    ToolCallHoldback h(llama);
    CHECK(h.Push("Here:\n{\"a\": ") == "Here:\n");
    CHECK(h.Push("{\"b\": 2}") == "");
    CHECK(h.Push("}") == "{\"a\": {\"b\": 2}}");
    CHECK(h.Push(" x = {1, 2}\n") == " x = {1, 2}\n");
    CHECK(h.Push("<|python_tag|>brave_search.call(query=\"x\")") == "<|python_tag|>brave_search.call(query=\"x\")");
    CHECK(h.Push("<|python") == "");
    CHECK(h.Push("_tag|>  ") == "");
    CHECK(h.Push("ok") == "<|python_tag|>  ok");
    const ParsedAnswer a = h.Finish();
    CHECK(a.calls.empty());
    CHECK(a.content.empty());
  }

  // Streamed in every split (two pieces, and a character at a time), an
  // answer gives what ParseToolCalls gives the whole: the same calls, and
  // the streamed text plus Finish's content is its content (as it was
  // without calls; with calls, the same but for white space).
  const std::vector<std::pair<ToolCallFormat, std::string>> answers = {
      {llama, "Let me check.\n{\"name\": \"a\", \"parameters\": {\"q\": \"}{\"}}; {\"name\": \"b\", \"parameters\": {}}"},
      {llama, "{\"a\": 1}\nthen\n<|python_tag|>{\"name\": \"f\", \"arguments\": \"{}\"}\nafter"},
      {llama, "No call {here}.\n{\"name\": \"x\"}\n<|python_tag|>web.call(q=1)\n{\"b\":"},
      {llama, "plain text only"},
      {mistral, "Sure.[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}, \"id\": \"aB3dE5gH9\"}] done"},
      {mistral, "[TOOL_CALLS]f[ARGS]{\"x\": 1}[TOOL_CALLS]g[ARGS]{}"},
      {mistral, "[TOOL_CALLS] bad [TOOL_CALLS]f[ARGS]{}"},
      {ToolCallFormat::kHermes, "A <tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call> B"},
  };
  for (const auto& [format, answer] : answers) {
    CAPTURE(answer);
    const ParsedAnswer whole = ParseToolCalls(answer, format);
    std::vector<std::vector<std::string>> splits;
    for (size_t cut = 0; cut <= answer.size(); ++cut) splits.push_back({answer.substr(0, cut), answer.substr(cut)});
    splits.emplace_back();
    for (char c : answer) splits.back().push_back(std::string(1, c));
    for (const auto& pieces : splits) {
      CAPTURE(pieces[0]);
      const Streamed s = StreamIn(format, pieces);
      REQUIRE(s.finish.calls.size() == whole.calls.size());
      for (size_t k = 0; k < whole.calls.size(); ++k) {
        CHECK(s.finish.calls[k].name == whole.calls[k].name);
        CHECK(s.finish.calls[k].arguments == whole.calls[k].arguments);
        // The model's ids are kept; made-up ones differ from parse to parse.
        const std::string& id = whole.calls[k].id;
        if (!id.empty() && answer.find(id) != std::string::npos) CHECK(s.finish.calls[k].id == id);
      }
      if (whole.calls.empty()) {
        CHECK(s.text + s.finish.content == answer);
      } else {
        CHECK(NoSpace(s.text + s.finish.content) == NoSpace(whole.content));
      }
    }
  }
}

// Whether the request's grammar accepts `text` whole.
bool Accepts(const GenerationParams& p, absl::string_view text) {
  REQUIRE(p.grammar != nullptr);
  grammar::Matcher m(p.grammar);
  return m.Accept(text).ok() && m.IsComplete();
}

TEST_CASE("structured output: response_format, grammar, json_schema, text.format") {
  const std::string msgs = R"("messages": [{"role": "user", "content": "hi"}])";
  auto chat = [&](const std::string& extra) { return ParseChatRequest("{" + msgs + ", " + extra + "}"); };
  auto r = chat(R"("response_format": {"type": "text"})");
  REQUIRE(r.ok());
  CHECK(r->params.grammar == nullptr);
  REQUIRE(ParseChatRequest("{" + msgs + "}").ok());
  CHECK(ParseChatRequest("{" + msgs + "}")->params.grammar == nullptr);

  r = chat(R"("response_format": {"type": "json_object"})");
  REQUIRE(r.ok());
  CHECK(Accepts(r->params, R"({"a": [1, "x"]})"));
  CHECK(!Accepts(r->params, "[1]"));

  // The schema's key order is the client's: "z" before "a".
  r = chat(R"("response_format": {"type": "json_schema", "json_schema": {"name": "t", "strict": true,
      "schema": {"type": "object", "properties": {"z": {"type": "integer"}, "a": {"type": "boolean"}},
                 "required": ["z", "a"]}}})");
  REQUIRE_MESSAGE(r.ok(), r.status().ToString());
  CHECK(Accepts(r->params, R"({"z": 1, "a": true})"));
  CHECK(!Accepts(r->params, R"({"a": true, "z": 1})"));
  CHECK(!Accepts(r->params, R"({"z": 1})"));

  r = chat(R"("grammar": "root ::= \"yes\" | \"no\"")");
  REQUIRE(r.ok());
  CHECK(Accepts(r->params, "no"));
  r = chat(R"("json_schema": {"type": "array", "items": {"type": "integer"}})");
  REQUIRE(r.ok());
  CHECK(Accepts(r->params, "[1, 2]"));

  auto c = ParseCompletionRequest(R"({"prompt": "x", "grammar": "root ::= [0-9]+"})");
  REQUIRE(c.ok());
  CHECK(Accepts(c->params, "42"));
  c = ParseCompletionRequest(R"({"prompt": "x", "json_schema": {"type": "boolean"}})");
  REQUIRE(c.ok());
  CHECK(Accepts(c->params, "true"));
  // response_format on /v1/completions (vLLM's completions API): enforced,
  // never silently ignored.
  c = ParseCompletionRequest(R"({"prompt": "x", "response_format": {"type": "json_schema",
      "json_schema": {"name": "a", "schema": {"type": "array", "items": {"type": "integer"}}}}})");
  REQUIRE_MESSAGE(c.ok(), c.status().ToString());
  REQUIRE(c->params.grammar != nullptr);
  CHECK(Accepts(c->params, "[1, 2]"));
  CHECK(!Accepts(c->params, "[\"a\"]"));
  c = ParseCompletionRequest(R"({"prompt": "x", "response_format": {"type": "yaml"}})");
  REQUIRE(!c.ok());
  CHECK(std::string(c.status().message()).find("'response_format.type'") == 0);

  auto resp = ParseResponsesRequest(R"({"input": "hi", "text": {"format": {"type": "json_schema", "name": "t",
      "schema": {"type": "object", "properties": {"b": {"type": "null"}}, "required": ["b"]}}}})");
  REQUIRE_MESSAGE(resp.ok(), resp.status().ToString());
  CHECK(Accepts(resp->params, R"({"b": null})"));
  resp = ParseResponsesRequest(R"({"input": "hi", "text": {"format": {"type": "text"}}})");
  REQUIRE(resp.ok());
  CHECK(resp->params.grammar == nullptr);
}

TEST_CASE("structured output errors name the field and the grammar engine's message") {
  const std::string msgs = R"("messages": [{"role": "user", "content": "hi"}])";
  auto err = [&](const std::string& extra) { return ErrorOf("{" + msgs + ", " + extra + "}"); };
  CHECK(err(R"("grammar": "root ::= \"a\"", "json_schema": {"type": "string"})").find("'grammar'") == 0);
  CHECK(err(R"("grammar": "root ::= \"a\"", "response_format": {"type": "json_object"})").find("'grammar'") == 0);
  CHECK(err(R"("response_format": {"type": "yaml"})").find("'response_format.type'") == 0);
  CHECK(err(R"("response_format": "json")").find("'response_format'") == 0);
  CHECK(err(R"("response_format": {"type": "json_schema"})").find("'response_format.json_schema'") == 0);
  CHECK(err(R"("response_format": {"type": "json_schema", "json_schema": {"name": "x"}})")
            .find("'response_format.json_schema.schema' is required") == 0);
  const std::string bad_schema =
      err(R"("response_format": {"type": "json_schema",
                               "json_schema": {"schema": {"type": "string", "pattern": "^a"}}})");
  CHECK(bad_schema.find("'response_format.json_schema.schema' is not usable: ") == 0);
  CHECK(bad_schema.find("pattern") != std::string::npos);
  const std::string bad_gbnf = err(R"("grammar": "root ::= \"a")");
  CHECK(bad_gbnf.find("'grammar' is not usable: ") == 0);
  CHECK(bad_gbnf.find("line") != std::string::npos);
  CHECK(err(R"("grammar": 3)").find("'grammar' must be a string") == 0);
  CHECK(err(R"("json_schema": {"not": {}})").find("'json_schema' is not usable: ") == 0);
  auto c = ParseCompletionRequest(R"({"prompt": "x", "grammar": "root ::= undefined"})");
  REQUIRE(!c.ok());
  CHECK(std::string(c.status().message()).find("'grammar' is not usable: ") == 0);
}


// tool_choice "required" and a named function (issue 32) are enforced by a
// grammar of the model's calls: what it accepts, ParseToolCalls reads back
// as calls of the offered tools, with arguments that follow their schemas.
using tokenizer::ToolCallFormat;

const std::string kForcedTools = R"("messages": [{"role": "user", "content": "x"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}},
              {"type": "function", "function": {"name": "get_time"}}])";

// The chat request of kForcedTools and `extra`, its tool_choice enforced for `format`.
ChatRequest Forced(const std::string& extra, ToolCallFormat format = ToolCallFormat::kHermes,
                   bool mistral_args = false) {
  absl::StatusOr<ChatRequest> r = ParseChatRequest("{" + kForcedTools + ", " + extra + "}");
  REQUIRE_MESSAGE(r.ok(), r.status().ToString());
  const absl::Status st = EnforceToolChoice(format, &*r, mistral_args);
  REQUIRE_MESSAGE(st.ok(), st.ToString());
  return *std::move(r);
}

// Whether the grammar accepts `text`, and then that it parses back into `calls` (names and arguments).
bool AcceptsCalls(const ChatRequest& r, ToolCallFormat format, const std::string& text,
                  const std::vector<ParsedToolCall>& calls) {
  if (!Accepts(r.params, text)) return false;
  const ParsedAnswer a = ParseToolCalls(text, format);
  CHECK(a.content.empty());
  REQUIRE(a.calls.size() == calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    CHECK(a.calls[i].name == calls[i].name);
    CHECK(a.calls[i].arguments == calls[i].arguments);
  }
  return true;
}

TEST_CASE("tool_choice required and named: a grammar of the model's calls") {
  const std::vector<ParsedToolCall> weather = {{"get_weather", R"({"city":"Paris","days":2})"}};
  const std::vector<ParsedToolCall> both = {{"get_weather", R"({"city":"Oslo"})"}, {"get_time", "{}"}};
  const std::string hermes_weather =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>";
  const std::string hermes_both =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  ChatRequest r = Forced(R"("tool_choice": "required")");
  CHECK(r.tools.size() == 2);
  CHECK(AcceptsCalls(r, ToolCallFormat::kHermes, hermes_weather, weather));
  CHECK(AcceptsCalls(r, ToolCallFormat::kHermes, hermes_both, both));
  CHECK(!Accepts(r.params, "Sure, let me look."));  // no call
  CHECK(!Accepts(r.params, ""));
  CHECK(!Accepts(r.params, "<tool_call>\n{\"name\": \"get_news\", \"arguments\": {}}\n</tool_call>"));
  CHECK(!Accepts(r.params, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"));
  CHECK(!Accepts(r.params,  // days must be an integer
                 "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\", \"days\": \"2\"}}\n</tool_call>"));
  CHECK(!Accepts(r.params, hermes_weather + "\nDone."));

  // parallel_tool_calls false, and a named function: exactly one call.
  r = Forced(R"("tool_choice": "required", "parallel_tool_calls": false)");
  CHECK(AcceptsCalls(r, ToolCallFormat::kHermes, hermes_weather, weather));
  CHECK(!Accepts(r.params, hermes_both));
  r = Forced(R"("tool_choice": {"type": "function", "function": {"name": "get_time"}})");
  CHECK(r.tools.size() == 1);
  CHECK(AcceptsCalls(r, ToolCallFormat::kHermes, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": [1]}}\n</tool_call>",
                     {{"get_time", R"({"tz":[1]})"}}));
  CHECK(!Accepts(r.params, hermes_weather));
  CHECK(!Accepts(r.params, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": []}\n</tool_call>"));

  // Llama 3.1's and Mistral's forms.
  r = Forced(R"("tool_choice": "required")", ToolCallFormat::kLlama3);
  CHECK(AcceptsCalls(r, ToolCallFormat::kLlama3, R"({"name": "get_weather", "parameters": {"city": "Paris", "days": 2}})",
                     weather));
  CHECK(AcceptsCalls(r, ToolCallFormat::kLlama3,
                     "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}\n{\"name\": \"get_time\", \"parameters\": {}}",
                     both));
  CHECK(!Accepts(r.params, R"({"name": "get_weather", "arguments": {"city": "Paris"}})"));
  r = Forced(R"("tool_choice": "required")", ToolCallFormat::kMistral);
  CHECK(AcceptsCalls(r, ToolCallFormat::kMistral,
                     R"([TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_time", "arguments": {}}])",
                     both));
  CHECK(!Accepts(r.params, R"([TOOL_CALLS][])"));
  CHECK(!Accepts(r.params, R"({"name": "get_time", "arguments": {}})"));
  // Mistral's v11 form (a template that writes calls so): the marker, the
  // name and [ARGS] before each call's arguments, no separator.
  r = Forced(R"("tool_choice": "required")", ToolCallFormat::kMistral, /*mistral_args=*/true);
  CHECK(AcceptsCalls(r, ToolCallFormat::kMistral,
                     R"([TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}[TOOL_CALLS]get_time[ARGS]{})", both));
  CHECK(AcceptsCalls(r, ToolCallFormat::kMistral, R"([TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 2})",
                     weather));
  CHECK(!Accepts(r.params, R"([TOOL_CALLS][{"name": "get_time", "arguments": {}}])"));
  CHECK(!Accepts(r.params, R"([TOOL_CALLS]get_time{})"));
  CHECK(!Accepts(r.params, R"([TOOL_CALLS]get_date[ARGS]{})"));
  // Named: that one call only.
  r = Forced(R"("tool_choice": {"type": "function", "function": {"name": "get_time"}})", ToolCallFormat::kMistral,
             /*mistral_args=*/true);
  CHECK(AcceptsCalls(r, ToolCallFormat::kMistral, R"([TOOL_CALLS]get_time[ARGS]{})", {{"get_time", "{}"}}));
  CHECK(!Accepts(r.params, R"([TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"})"));

  // The Responses API's flat named choice.
  auto resp = ParseResponsesRequest(R"({"input": "x", "tools": [{"type": "function", "name": "a"},
      {"type": "function", "name": "b", "parameters": {"type": "object", "properties": {"n": {"type": "integer"}},
                                                         "required": ["n"]}}],
      "tool_choice": {"type": "function", "name": "b"}})");
  REQUIRE_MESSAGE(resp.ok(), resp.status().ToString());
  REQUIRE(EnforceToolChoice(ToolCallFormat::kHermes, &*resp).ok());
  CHECK(AcceptsCalls(*resp, ToolCallFormat::kHermes, "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"n\": 7}}\n</tool_call>",
                     {{"b", R"({"n":7})"}}));
  CHECK(!Accepts(resp->params, "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>"));
}

// A vocabulary of every byte (one token each) and the tool-call markers,
// control tokens (Mistral's [TOOL_CALLS] is one in its vocabularies) or,
// with `markers_are_text`, user-defined text tokens (Qwen2.5's <tool_call>).
struct MarkerVocab {
  static constexpr int32_t kCalls = 256, kOpen = 257, kClose = 258, kImStart = 259, kEnd = 260;
  grammar::Vocabulary v;
  explicit MarkerVocab(bool markers_are_text = false) : v(Make(markers_are_text)) {}
  static grammar::Vocabulary Make(bool text) {
    std::vector<std::string> pieces;
    for (int b = 0; b < 256; ++b) pieces.push_back(std::string(1, static_cast<char>(b)));
    for (const char* m : {"[TOOL_CALLS]", "<tool_call>", "</tool_call>", "<|im_start|>", "<|im_end|>"}) pieces.push_back(m);
    std::vector<grammar::TokenKind> kinds(pieces.size(), grammar::TokenKind::kText);
    for (int32_t id : {kCalls, kOpen, kClose}) kinds[id] = text ? grammar::TokenKind::kText : grammar::TokenKind::kControl;
    kinds[kImStart] = grammar::TokenKind::kControl;
    kinds[kEnd] = grammar::TokenKind::kEndOfGeneration;
    return grammar::Vocabulary(std::move(pieces), std::move(kinds));
  }
  // The tokens the matcher allows now.
  std::vector<int32_t> Allowed(grammar::Matcher& m) const {
    std::vector<uint32_t> bits(v.mask_words());
    m.FillMask(v, absl::MakeSpan(bits));
    std::vector<int32_t> ids;
    for (int32_t id = 0; id < v.size(); ++id) {
      if ((bits[id >> 5] >> (id & 31)) & 1) ids.push_back(id);
    }
    return ids;
  }
  // `text` one byte a token; the answer's text grows by it.
  bool Feed(grammar::Matcher& m, const std::string& text, std::string* answer) const {
    for (unsigned char c : text) {
      if (!m.AcceptToken(v, c).ok()) return false;
    }
    *answer += text;
    return true;
  }
};

bool Contains(const std::vector<int32_t>& ids, int32_t id) { return std::find(ids.begin(), ids.end(), id) != ids.end(); }

TEST_CASE("tool_choice forced: a marker that is a control token is that token, where the grammar writes it only") {
  // Mistral: [TOOL_CALLS] is a control token (as in Mistral's vocabularies).
  const MarkerVocab mv;
  ChatRequest r = Forced(R"("tool_choice": "required")", ToolCallFormat::kMistral);
  grammar::Matcher m(r.params.grammar, &mv.v);
  CHECK(mv.Allowed(m) == std::vector<int32_t>{MarkerVocab::kCalls});  // not "[" spelling it
  REQUIRE(m.AcceptToken(mv.v, MarkerVocab::kCalls).ok());
  std::string answer = mv.v.piece(MarkerVocab::kCalls);  // detokenized: a control token's piece is its text
  REQUIRE(mv.Feed(m, R"([{"name": "get_weather", "arguments": {"city": ")", &answer));
  // Inside the arguments' string: any text, its "[TOOL_CALLS]" too, but no control token.
  std::vector<int32_t> inside = mv.Allowed(m);
  CHECK(Contains(inside, '['));
  for (int32_t id : {MarkerVocab::kCalls, MarkerVocab::kOpen, MarkerVocab::kClose, MarkerVocab::kImStart, MarkerVocab::kEnd}) {
    CHECK_FALSE(Contains(inside, id));
  }
  CHECK_FALSE(m.AcceptToken(mv.v, MarkerVocab::kCalls).ok());
  REQUIRE(mv.Feed(m, R"([TOOL_CALLS] <|im_start|>"}}, {"name": "get_time", "arguments": {}}])", &answer));
  CHECK(mv.Allowed(m) == std::vector<int32_t>{MarkerVocab::kEnd});
  const ParsedAnswer a = ParseToolCalls(answer, ToolCallFormat::kMistral);
  CHECK(a.content.empty());
  REQUIRE(a.calls.size() == 2);
  CHECK(a.calls[0].name == "get_weather");
  CHECK(a.calls[0].arguments == R"({"city":"[TOOL_CALLS] <|im_start|>"})");
  CHECK(a.calls[1].name == "get_time");
  // Under a vocabulary without the control token (or no vocabulary), the
  // marker is its text, as before.
  CHECK(Accepts(r.params, R"([TOOL_CALLS][{"name": "get_time", "arguments": {}}])"));
  grammar::Matcher text_only(r.params.grammar);
  CHECK(text_only.Accept("[TOOL_CALLS]").ok());

  // Hermes: <tool_call> and </tool_call>, control tokens here, each that token.
  r = Forced(R"("tool_choice": {"type": "function", "function": {"name": "get_time"}})", ToolCallFormat::kHermes);
  grammar::Matcher h(r.params.grammar, &mv.v);
  CHECK(mv.Allowed(h) == std::vector<int32_t>{MarkerVocab::kOpen});
  REQUIRE(h.AcceptToken(mv.v, MarkerVocab::kOpen).ok());
  answer = mv.v.piece(MarkerVocab::kOpen);
  REQUIRE(mv.Feed(h, "\n{\"name\": \"get_time\", \"arguments\": {}}\n", &answer));
  CHECK(mv.Allowed(h) == std::vector<int32_t>{MarkerVocab::kClose});
  CHECK_FALSE(h.Accept("</tool_call>").ok());
  REQUIRE(h.AcceptToken(mv.v, MarkerVocab::kClose).ok());
  answer += mv.v.piece(MarkerVocab::kClose);
  CHECK(mv.Allowed(h) == std::vector<int32_t>{MarkerVocab::kEnd});
  const ParsedAnswer b = ParseToolCalls(answer, ToolCallFormat::kHermes);
  REQUIRE(b.calls.size() == 1);
  CHECK(b.calls[0].name == "get_time");

  // Qwen2.5 / Qwen3: <tool_call> is a user-defined token, text: the grammar
  // takes it as one piece or spelled.
  const MarkerVocab qwen(/*markers_are_text=*/true);
  grammar::Matcher q(r.params.grammar, &qwen.v);
  const std::vector<int32_t> first = qwen.Allowed(q);
  CHECK(first == std::vector<int32_t>{'<', MarkerVocab::kOpen});
}

TEST_CASE("tool_choice auto and none: no grammar; required without a way to call: a 400") {
  for (const char* choice : {R"("tool_choice": "auto")", R"("tool_choice": "none")", R"("parallel_tool_calls": false)"}) {
    INFO(choice);
    const ChatRequest r = Forced(choice);
    CHECK(r.forced_tools.empty());
    CHECK(r.params.grammar == nullptr);
  }
  // auto with response_format: its grammar, as before.
  CHECK(Forced(R"("tool_choice": "auto", "response_format": {"type": "json_object"})").params.grammar != nullptr);
  // A template with no tool format: nothing to enforce for auto; required is refused.
  ChatRequest none = *ParseChatRequest("{" + kForcedTools + R"(, "tool_choice": "auto"})");
  CHECK(EnforceToolChoice(ToolCallFormat::kNone, &none).ok());
  ChatRequest req = *ParseChatRequest("{" + kForcedTools + R"(, "tool_choice": "required"})");
  const absl::Status no_format = EnforceToolChoice(ToolCallFormat::kNone, &req);
  CHECK(no_format.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(no_format.message()).find("chat template writes no tools") != std::string::npos);
  CHECK(req.params.grammar == nullptr);

  auto err = [](const std::string& extra) { return ErrorOf("{" + kForcedTools + ", " + extra + "}"); };
  CHECK(err(R"("tool_choice": "required", "response_format": {"type": "json_object"})") ==
        "'tool_choice' forces a tool call (a grammar of calls), and 'response_format' constrains the answer too: "
        "give one");
  CHECK(err(R"("tool_choice": {"type": "function", "function": {"name": "get_time"}}, "grammar": "root ::= \"a\"")")
            .find("and 'grammar' constrains the answer too") != std::string::npos);
  CHECK(err(R"("tool_choice": "required", "parallel_tool_calls": 1)") == "'parallel_tool_calls' must be true or false");
  CHECK(ErrorOf(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})") ==
        "'tool_choice' forces a tool call, but no 'tools' are given");
  CHECK(ErrorOf(R"({"messages": [{"role": "user", "content": "x"}], "tools": [], "tool_choice": "required"})") ==
        "'tool_choice' is \"required\", but 'tools' is empty");
  auto resp = ParseResponsesRequest(R"({"input": "x", "tools": [{"type": "function", "name": "a"}],
      "tool_choice": "required", "text": {"format": {"type": "json_object"}}})");
  REQUIRE(!resp.ok());
  CHECK(std::string(resp.status().message()).find("'text.format' constrains the answer too") != std::string::npos);
  // A parameters schema the grammar cannot follow: named when enforced.
  ChatRequest bad = *ParseChatRequest(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required",
      "tools": [{"type": "function", "function": {"name": "a", "parameters": {"type": "string", "pattern": "^a"}}}]})");
  const absl::Status st = EnforceToolChoice(ToolCallFormat::kHermes, &bad);
  CHECK(std::string(st.message()).find("'tools[0].function.parameters' is not usable: ") == 0);
  CHECK(std::string(st.message()).find("pattern") != std::string::npos);
}

}  // namespace
}  // namespace dpl::server

namespace dpl::server {
namespace {

// Issue 32's fields: chat's logprobs / top_logprobs, completions' logprobs N
// and echo, and their refusals.
TEST_CASE("logprobs fields: parsed, and refused where OpenAI refuses them") {
  const char* kMsgs = R"("messages": [{"role": "user", "content": "hi"}])";
  auto chat = ParseChatRequest(absl::StrCat("{", kMsgs, R"(, "logprobs": true, "top_logprobs": 5})"));
  REQUIRE_MESSAGE(chat.ok(), chat.status().ToString());
  CHECK(chat->params.logprobs == 5);
  auto bare = ParseChatRequest(absl::StrCat("{", kMsgs, R"(, "logprobs": true})"));
  REQUIRE(bare.ok());
  CHECK(bare->params.logprobs == 0);
  auto off = ParseChatRequest(absl::StrCat("{", kMsgs, R"(, "logprobs": false})"));
  REQUIRE(off.ok());
  CHECK(off->params.logprobs == -1);
  CHECK(ErrorOf(absl::StrCat("{", kMsgs, R"(, "top_logprobs": 2})")).find("top_logprobs") != std::string::npos);
  CHECK(ErrorOf(absl::StrCat("{", kMsgs, R"(, "logprobs": false, "top_logprobs": 2})")).find("'logprobs': true") !=
        std::string::npos);
  CHECK(ErrorOf(absl::StrCat("{", kMsgs, R"(, "logprobs": true, "top_logprobs": 21})")).find("top_logprobs") !=
        std::string::npos);
  CHECK(ErrorOf(absl::StrCat("{", kMsgs, R"(, "logprobs": 3})")).find("logprobs") != std::string::npos);

  auto c = ParseCompletionRequest(R"({"prompt": "a b", "logprobs": 1, "echo": true, "max_tokens": 0})");
  REQUIRE_MESSAGE(c.ok(), c.status().ToString());
  CHECK(c->params.logprobs == 1);
  CHECK(c->params.echo);
  CHECK(c->params.max_tokens == 0);
  auto plain = ParseCompletionRequest(R"({"prompt": "a", "logprobs": null})");
  REQUIRE(plain.ok());
  CHECK(plain->params.logprobs == -1);
  CHECK(!plain->params.echo);
  auto twenty = ParseCompletionRequest(R"({"prompt": "a", "logprobs": 20})");
  REQUIRE(twenty.ok());
  CHECK(twenty->params.logprobs == 20);
  for (const char* bad : {R"({"prompt": "a", "logprobs": 21})", R"({"prompt": "a", "logprobs": -1})",
                          R"({"prompt": "a", "logprobs": true})", R"({"prompt": "a", "echo": 1})"}) {
    auto r = ParseCompletionRequest(bad);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  }
}

// Issue 32: OpenAI's object form and llama-server's array form (false:
// a ban), on every endpoint that parses the sampling fields.
TEST_CASE("logit_bias: both forms parse; each bad entry is a 400 naming it") {
  const char* kMsgs = R"("messages": [{"role": "user", "content": "hi"}])";
  auto chat = ParseChatRequest(absl::StrCat("{", kMsgs, R"(, "logit_bias": {"15339": -100, "7": 2.5, "0": 100}})"));
  REQUIRE_MESSAGE(chat.ok(), chat.status().ToString());
  const std::vector<LogitBias>& b = chat->params.logit_bias;
  REQUIRE(b.size() == 3);  // ascending ids
  CHECK((b[0].token == 0 && b[0].bias == 100.0f));
  CHECK((b[1].token == 7 && b[1].bias == 2.5f));
  CHECK((b[2].token == 15339 && b[2].bias == -100.0f));

  auto c = ParseCompletionRequest(R"({"prompt": "a", "logit_bias": [[42, false], [3, -1.5], [42, 10], [9, false]]})");
  REQUIRE_MESSAGE(c.ok(), c.status().ToString());
  const std::vector<LogitBias>& a = c->params.logit_bias;
  REQUIRE(a.size() == 3);
  CHECK((a[0].token == 3 && a[0].bias == -1.5f));
  CHECK((a[1].token == 9 && a[1].bias == -INFINITY));
  CHECK((a[2].token == 42 && a[2].bias == 10.0f));  // the later entry of 42 wins
  auto obj_false = ParseCompletionRequest(R"({"prompt": "a", "logit_bias": {"5": false}})");
  REQUIRE(obj_false.ok());
  CHECK(obj_false->params.logit_bias[0].bias == -INFINITY);
  auto responses = ParseResponsesRequest(R"({"input": "hi", "logit_bias": {"12": -3}})");
  REQUIRE_MESSAGE(responses.ok(), responses.status().ToString());
  REQUIRE(responses->params.logit_bias.size() == 1);
  CHECK(responses->params.logit_bias[0].token == 12);
  for (const char* none : {R"({"prompt": "a"})", R"({"prompt": "a", "logit_bias": null})",
                           R"({"prompt": "a", "logit_bias": {}})", R"({"prompt": "a", "logit_bias": []})"}) {
    auto r = ParseCompletionRequest(none);
    REQUIRE(r.ok());
    CHECK(r->params.logit_bias.empty());
  }

  auto with = [&](const std::string& field) { return ErrorOf(absl::StrCat("{", kMsgs, ", ", field, "}")); };
  CHECK(with(R"("logit_bias": 5)").find("'logit_bias' must be an object") != std::string::npos);
  CHECK(with(R"("logit_bias": {"hello": 1})").find("'logit_bias' key \"hello\" is not a token id") !=
        std::string::npos);
  CHECK(with(R"("logit_bias": {"-1": 1})").find("key \"-1\" is not a token id") != std::string::npos);
  CHECK(with(R"("logit_bias": {"1.5": 1})").find("key \"1.5\"") != std::string::npos);
  CHECK(with(R"("logit_bias": {"99999999999": 1})").find("is not a token id") != std::string::npos);
  CHECK(with(R"("logit_bias": {"15": 101})").find("'logit_bias.15' must be a number in [-100, 100] or false") !=
        std::string::npos);
  CHECK(with(R"("logit_bias": {"15": -100.5})").find("'logit_bias.15'") != std::string::npos);
  CHECK(with(R"("logit_bias": {"15": true})").find("'logit_bias.15'") != std::string::npos);
  CHECK(with(R"("logit_bias": {"15": "1"})").find("'logit_bias.15'") != std::string::npos);
  CHECK(with(R"("logit_bias": [5])").find("'logit_bias[0]' must be a [token id, bias] pair") != std::string::npos);
  CHECK(with(R"("logit_bias": [[1, 2], [1, 2, 3]])").find("'logit_bias[1]' must be a [token id, bias] pair") !=
        std::string::npos);
  CHECK(with(R"("logit_bias": [["hello", 2]])").find("'logit_bias[0][0]' is not a token id") != std::string::npos);
  CHECK(with(R"("logit_bias": [[-3, 2]])").find("'logit_bias[0][0]'") != std::string::npos);
  CHECK(with(R"("logit_bias": [[3.5, 2]])").find("'logit_bias[0][0]'") != std::string::npos);
  CHECK(with(R"("logit_bias": [[3, 200]])").find("'logit_bias[0][1]' must be a number in [-100, 100] or false") !=
        std::string::npos);
  CHECK(with(R"("logit_bias": [[3, true]])").find("'logit_bias[0][1]'") != std::string::npos);
  // At most kMaxLogitBias (1024) entries, in either form.
  std::string many = "{";
  std::string pairs = "[";
  for (int i = 0; i <= kernels::kMaxLogitBias; ++i) {
    absl::StrAppend(&many, i > 0 ? ", " : "", "\"", i, "\": -1");
    absl::StrAppend(&pairs, i > 0 ? ", " : "", "[", i, ", -1]");
  }
  many += "}";
  pairs += "]";
  CHECK(with(absl::StrCat(R"("logit_bias": )", many)).find("'logit_bias' has 1025 entries; at most 1024") !=
        std::string::npos);
  CHECK(with(absl::StrCat(R"("logit_bias": )", pairs)).find("'logit_bias' has 1025 entries") != std::string::npos);
  auto full = ParseChatRequest(absl::StrCat("{", kMsgs, R"(, "logit_bias": )",
                                            pairs.substr(0, pairs.rfind(", [")) + "]}"));
  REQUIRE_MESSAGE(full.ok(), full.status().ToString());
  CHECK(full->params.logit_bias.size() == static_cast<size_t>(kernels::kMaxLogitBias));
}

tokenizer::Tokenizer QwenTokenizer() {
  auto f = formats::ModelFile::Open(testing::SharedDir() + "/oracle/tiny-qwen2-vocab-q4km.gguf");
  REQUIRE_MESSAGE(f.ok(), f.status().ToString());
  auto t = tokenizer::Tokenizer::FromMetadata((*f)->metadata());
  REQUIRE(t.ok());
  return *std::move(t);
}

TEST_CASE("logprobs JSON: chat's content entries, completions' lists, chunks and responses") {
  const tokenizer::Tokenizer tok = QwenTokenizer();
  const std::vector<int32_t> hello = tok.Encode("hello world", false, false);
  REQUIRE(hello.size() == 2);
  // A token that is part of a UTF-8 character: its text in OpenAI's bytes form.
  int32_t partial = -1;
  for (int32_t id = 0; id < 1000 && partial < 0; ++id) {
    const std::string piece = tok.TokenToPiece(id);
    if (piece.size() == 1 && static_cast<unsigned char>(piece[0]) >= 0xC0) partial = id;
  }
  REQUIRE(partial >= 0);
  const unsigned char byte = static_cast<unsigned char>(tok.TokenToPiece(partial)[0]);
  generate::TokenLogprobs a{{hello[0], -0.5f}, {{hello[0], -0.5f}, {partial, -1.5f}}};
  generate::TokenLogprobs b{{partial, -2.0f}, {{hello[1], -0.25f}, {partial, -2.0f}}};
  const std::vector<generate::TokenLogprobs> entries = {a, b};

  const json chat = ChatLogprobsJson(tok, entries);
  REQUIRE(chat["content"].size() == 2);
  const json& first = chat["content"][0];
  CHECK(first["token"] == "hello");
  CHECK(first["logprob"].get<double>() == -0.5);
  CHECK(first["bytes"] == json::array({'h', 'e', 'l', 'l', 'o'}));
  REQUIRE(first["top_logprobs"].size() == 2);
  CHECK(first["top_logprobs"][0] == json({{"token", "hello"}, {"logprob", -0.5}, {"bytes", first["bytes"]}}));
  const json& second = chat["content"][1];
  char want[16];
  std::snprintf(want, sizeof(want), "bytes:\\x%02x", byte);
  CHECK(second["token"] == want);
  CHECK(second["bytes"] == json::array({byte}));
  CHECK(second["top_logprobs"][0]["token"] == " world");

  // Completions with an echoed prompt: its first token unscored.
  json lists;
  size_t offset = 0;
  AppendCompletionLogprobs(tok, hello[0], std::vector<generate::TokenLogprobs>{{{hello[1], -3.0f}, {}}}, &offset,
                           &lists);
  CHECK(offset == 11);
  AppendCompletionLogprobs(tok, -1, entries, &offset, &lists);
  CHECK(lists["tokens"] == json::array({"hello", " world", "hello", want}));
  CHECK(lists["token_logprobs"] == json::array({nullptr, -3.0, -0.5, -2.0}));
  CHECK(lists["top_logprobs"][0].is_null());
  CHECK(lists["top_logprobs"][1] == json::object());
  CHECK(lists["top_logprobs"][2] == json({{"hello", -0.5}, {want, -1.5}}));
  CHECK(lists["text_offset"] == json::array({0, 5, 11, 16}));
  CHECK(offset == 17);
  json empty;
  size_t at = 0;
  AppendCompletionLogprobs(tok, -1, {}, &at, &empty);
  CHECK(empty == json({{"tokens", json::array()}, {"token_logprobs", json::array()},
                       {"top_logprobs", json::array()}, {"text_offset", json::array()}}));

  const ResponseHead head{"x", 1, "m"};
  const FinishReason length = FinishReason::kLength;
  const json chunk = ChatChunkJson(head, 0, false, "hello", nullptr, chat);
  CHECK(chunk["choices"][0]["logprobs"] == chat);
  CHECK(!ChatChunkJson(head, 0, false, "hello", nullptr)["choices"][0].contains("logprobs"));
  CHECK(CompletionChunkJson(head, 0, "hello", &length, lists)["choices"][0]["logprobs"] == lists);
  CHECK(CompletionChunkJson(head, 0, "hello", nullptr)["choices"][0]["logprobs"].is_null());
  CompletionChoice choice("hello world", FinishReason::kLength);
  CHECK(CompletionJson(head, {choice}, 2, 0)["choices"][0]["logprobs"].is_null());
  CHECK(!ChatCompletionJson(head, {choice}, 2, 0)["choices"][0].contains("logprobs"));
  choice.logprobs = lists;
  CHECK(CompletionJson(head, {choice}, 2, 0)["choices"][0]["logprobs"] == lists);
  choice.logprobs = chat;
  CHECK(ChatCompletionJson(head, {choice}, 2, 0)["choices"][0]["logprobs"] == chat);
  // -inf never reaches the JSON (a masked token is never listed); the
  // serialization of the lists is plain JSON.
  CHECK(Dump(lists).find("\"token_logprobs\":[null,-3.0,-0.5,-2.0]") != std::string::npos);
}

}  // namespace
}  // namespace dpl::server
