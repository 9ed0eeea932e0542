// The OpenAI HTTP API's JSON, without HTTP: request bodies parsed into
// structs (every error an InvalidArgument naming the field), responses and
// stream chunks built, errors as OpenAI's {"error": {message, type, code}}.
// http_server.cc is the only user; the unit tests drive it directly.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "runtime/generate/logprobs.h"
#include "runtime/grammar/grammar.h"
#include "runtime/server/batch_engine.h"
#include "runtime/server/scheduler.h"
#include "runtime/tokenizer/chat_template.h"
#include "runtime/tokenizer/tokenizer.h"

namespace dpl::server {

// What /v1/chat/completions and /v1/completions share.
struct GenerationParams {
  std::string model;            // empty: not given
  int n = 1;                    // choices per prompt (samples of it, seeds seed, seed + 1, ...)
  SamplerParams sampling;       // llama-server's defaults for fields not given
  bool seed_given = false;      // otherwise the caller picks a random seed
  int32_t max_tokens = -1;      // max_tokens or max_completion_tokens; -1: not given, or -1
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;   // stream_options.include_usage
  bool ignore_eos = false;      // llama-server's extension
  bool cache_prompt = true;     // llama-server's: a slot's cached prompt start may be reused
  bool parse_tool_calls = false;  // tools were offered: an answer's calls are parsed
  // How the answer's calls look (the chat template's tool_call_format();
  // the server sets it, the body parsers leave kHermes).
  tokenizer::ToolCallFormat tool_format = tokenizer::ToolCallFormat::kHermes;
  // Structured output: response_format {"type": "json_object"} or
  // {"type": "json_schema", "json_schema": {"schema": ...}} (chat), the
  // Responses API's text.format, llama-server's `grammar` (GBNF) and
  // `json_schema` (chat and completions), or the calls tool_choice
  // "required" or a named function forces (EnforceToolChoice); null: free text.
  std::shared_ptr<const grammar::Grammar> grammar;
  // Logprobs (issue 32): alternatives listed per token, 0..20; -1: none.
  // Chat: logprobs true sets it (top_logprobs, default 0); completions:
  // logprobs N. echo (completions): the prompt's text before the answer,
  // and with logprobs the prompt tokens' entries before the answer's.
  int logprobs = -1;
  bool echo = false;
  // OpenAI's logit_bias, {"ID": bias, ...}, or llama-server's array form
  // [[ID, bias], ...] (bias `false`: -inf, never drawn; also as an object's
  // value): distinct tokens, sorted by id (an id given twice: the later
  // entry wins; an object's keys in the parser's order), biases in
  // [-100, 100], at most kernels::kMaxLogitBias entries (1024, the device's
  // per-sequence list). The ids are checked against the vocabulary at Submit.
  std::vector<LogitBias> logit_bias;
};


// An offered function as a forced call's grammar needs it.
struct ToolSchema {
  std::string name;
  nlohmann::ordered_json parameters;  // its JSON schema, in the client's key order; null: none given
  std::string field;                  // where the schema is, for errors ("tools[0].function.parameters")
};

struct ChatRequest {
  GenerationParams params;
  std::vector<tokenizer::ChatMessage> messages;
  // The tools the template gets (ChatOptions::tools), each as Jinja's tojson
  // writes it: all of `tools`, the one a named tool_choice picks, none for
  // tool_choice "none".
  std::vector<std::string> tools;
  // tool_choice "required" (all of `tools`) or a named function (that one):
  // the answer must be calls of these; empty for "auto", "none" or no
  // tool_choice. EnforceToolChoice makes them params.grammar.
  std::vector<ToolSchema> forced_tools;
  bool one_call = false;  // a named function, or parallel_tool_calls false: exactly one call
};

struct CompletionPrompt {
  bool has_ids = false;         // token ids, not text
  std::string text;
  std::vector<int32_t> ids;
};

// Prompts a /v1/completions request may list, and choices (prompts x n) a
// request may ask for; more is a 400 (and each choice still needs a slot or
// a queue place).
inline constexpr size_t kMaxCompletionPrompts = 64;
inline constexpr int kMaxChoices = 64;

struct CompletionRequest {
  GenerationParams params;
  std::vector<CompletionPrompt> prompts;  // choice i answers prompts[i]
};

// Every body is parsed within these (InvalidArgument beyond, naming the
// limit): no sane request nests deeper or holds more (a prompt of a million
// token ids), and the parse of a 16 MiB body stays under ~25 MB.
inline constexpr int kMaxJsonDepth = 64;
inline constexpr size_t kMaxJsonValues = size_t{1} << 20;

// Body parsers. Errors (InvalidArgument) name the field: "bad JSON at byte
// 12: ...", "'messages' is required", "'temperature' must be a number",
// "'n' must be in [1, 64]", "'presence_penalty' must be in [-2, 2]".
// Supported: model, messages (system/developer/user/assistant; content a
// string or an array of {"type": "text"} parts), prompt (a string, an
// array of ids, or a list of either: one choice each), max_tokens, max_completion_tokens,
// temperature, top_p, top_k, min_p, seed, stop (string or array),
// repeat_penalty, repeat_last_n, presence_penalty and frequency_penalty
// (-2..2), n (samples of each prompt, up to 64 choices in all), stream,
// stream_options.include_usage, ignore_eos, cache_prompt; logit_bias
// ({"ID": -100..100} or [[ID, -100..100 or false], ...], at most 1024
// entries: "'logit_bias' key \"x\" is not a token id"); logprobs (true)
// and top_logprobs (0..20; without logprobs true a 400, as OpenAI's);
// tools
// ({"type": "function", "function": {name, description, parameters}}),
// tool_choice ("auto", "none", "required" or {"type": "function",
// "function": {"name"}}; "required" and a named choice go to forced_tools,
// and need tools, and no response_format, grammar or json_schema beside
// them), parallel_tool_calls (false: one call at most), messages of role
// tool ({content, tool_call_id}) and an assistant's tool_calls.
absl::StatusOr<ChatRequest> ParseChatRequest(absl::string_view body);

// tool_choice "required" or a named function, enforced once the model's call
// format is known: r->params.grammar becomes a grammar of answers that are
// only calls (one when r->one_call, else one or more), written as `format`
// writes them and ParseToolCalls reads them back, each naming one of
// r->forced_tools with arguments that follow its parameters schema (any
// JSON object where it has none):
//   kHermes   <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>,
//             "\n" between calls
//   kLlama3   {"name": "f", "parameters": {...}}, "\n" between calls
//             (no <|python_tag|>)
//   kMistral  [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...] (the
//             JSON form; the ids made up), or with mistral_args (a template
//             that writes calls as v11's, ChatTemplate::mistral_args_calls)
//             [TOOL_CALLS]f[ARGS]{...}, the marker again before each call
// The markers (<tool_call>, </tool_call>, [TOOL_CALLS]) are the grammar's
// token literals: where the model's vocabulary has the marker as a control
// token (Mistral's [TOOL_CALLS]), the grammar takes that one token there,
// and nowhere else (never inside the arguments' strings); otherwise its
// text. The detokenized answer holds the marker's text either way (a
// control token's piece is its text), which ParseToolCalls reads. Llama's
// form writes no marker (<|python_tag|>, a control token of Llama 3.1,
// is not in it). Nothing to enforce:
// OK, the request unchanged. InvalidArgument for kNone (the template writes
// no tools) and for a parameters schema the grammar cannot follow (naming
// its field).
absl::Status EnforceToolChoice(tokenizer::ToolCallFormat format, ChatRequest* r, bool mistral_args = false);

// Python's json.dumps(x, ensure_ascii=False) of a JSON value (", " and ": "
// separators, keys in the order given): what Jinja's tojson writes into a
// chat template.
std::string PythonJson(const nlohmann::ordered_json& value);

// The calls in an answer, in the chat template's format (llama.cpp's
// common/chat.cpp parsers, written anew). In every format content is the
// text outside the calls, trimmed, and the answer as it was when it holds no
// call; a call's arguments are the JSON object's compact text.
//   kHermes (Qwen, Hermes): each "<tool_call>{"name": ..., "arguments":
//     {...}}</tool_call>" block, its JSON parsed. A block that does not close
//     or whose JSON is not such an object ends the parse: it and the rest
//     stay content.
//   kLlama3: a JSON object {"name": string, "parameters": {...}} (or
//     "arguments"; either as an object or as a string holding one; an
//     optional "type": "function"; no other keys) that starts the answer or
//     a line, or follows <|python_tag|>; several in a row, separated by ";"
//     or white space. An object that is not such a call, and a built-in
//     tool call (<|python_tag|>brave_search.call(query="...")), stay
//     content; an object that does not close ends the parse. (llama.cpp
//     takes one call, at the start of the answer only.)
//   kMistral: "[TOOL_CALLS]" and a JSON array of {"name", "arguments"
//     (object or string holding one), "id"} objects (or one such object),
//     or v11 tekken's "[TOOL_CALLS]name[ARGS]{...}" (with "[CALL_ID]id"
//     before [ARGS] in later ones); a block after each marker. A block that
//     is not such calls ends the parse: it and the rest stay content. A
//     call's id is the model's when it is 9 letters and digits, else one made
//     up that is (Mistral's templates take no other).
struct ParsedToolCall {
  ParsedToolCall() = default;
  ParsedToolCall(std::string n, std::string args, std::string call_id = "")
      : name(std::move(n)), arguments(std::move(args)), id(std::move(call_id)) {}

  std::string name;
  std::string arguments;  // a JSON text (OpenAI's function.arguments)
  std::string id;         // empty: made up in the response ("call_...")
};
struct ParsedAnswer {
  std::string content;
  std::vector<ParsedToolCall> calls;
};
ParsedAnswer ParseToolCalls(const std::string& text,
                            tokenizer::ToolCallFormat format = tokenizer::ToolCallFormat::kHermes);

// A streamed answer with tools offered: its text goes out as it comes up to
// where a call may begin (kHermes: "<tool_call>"; kMistral: "[TOOL_CALLS]";
// kLlama3: "<|python_tag|>" or a "{" that starts the answer or a line), and
// a tail that may begin such a marker waits for the next text. From there
// the text is held and parsed when the answer ends; kLlama3 alone lets the
// held text go again once it is plainly no call (a closed JSON object that
// is not one, a python tag before something else), so that JSON in an
// answer does not stop its stream. Finish() and ParseToolCalls of the whole
// answer agree: the content streamed plus Finish's content is the answer's
// content (untrimmed), the calls are the same.
class ToolCallHoldback {
 public:
  explicit ToolCallHoldback(tokenizer::ToolCallFormat format = tokenizer::ToolCallFormat::kHermes)
      : format_(format) {}
  // The text that can go out now.
  std::string Push(const std::string& text);
  // What was held, parsed: content (the held text itself when it holds no
  // call) and the calls.
  ParsedAnswer Finish() const;

 private:
  tokenizer::ToolCallFormat format_;
  std::string text_;        // the answer so far
  size_t sent_ = 0;         // text_[0, sent_) went out
  bool in_call_ = false;    // held from sent_ to the end: a call begins there
  bool undecided_ = false;  // kLlama3: held from sent_, maybe a call
  bool need_close_ = false; // kLlama3: undecided until a '}' or ']' comes
};
// POST /v1/responses (OpenAI's Responses API), text in and out: `input` a
// string (one user message) or an array of messages ({role, content} or
// {"type": "message", role, content}; content a string or input_text /
// output_text parts), `instructions` a system message before them,
// `max_output_tokens`, the sampling fields above, function `tools` (flat:
// {"type": "function", "name", ...}), `tool_choice` (a named function flat:
// {"type": "function", "name"}) and `parallel_tool_calls`, as chat's (so
// also forced_tools), and function_call /
// function_call_output input items (a call joins the assistant message
// before it; an output is a tool result). Other items (images, reasoning)
// are refused, naming the item.
absl::StatusOr<ChatRequest> ParseResponsesRequest(absl::string_view body);
// /v1/completions: prompt and the fields above but the chat ones, plus
// logprobs (0..20 alternatives per token) and echo.
absl::StatusOr<CompletionRequest> ParseCompletionRequest(absl::string_view body);
// POST /tokenize {"content": text, "add_special": bool=false}.
absl::StatusOr<std::pair<std::string, bool>> ParseTokenizeRequest(absl::string_view body);
// POST /detokenize {"tokens": [ids]}.
absl::StatusOr<std::vector<int32_t>> ParseDetokenizeRequest(absl::string_view body);

// The HTTP status of an error (InvalidArgument/OutOfRange 400,
// Unauthenticated 401, NotFound 404, ResourceExhausted/Unavailable 503,
// anything else 500) and its OpenAI body.
int HttpStatus(const absl::Status& status);
nlohmann::json ErrorJson(const absl::Status& status);
// The body of an HTTP-level refusal (408, 411, 413, 415, 417, 431, ...):
// type invalid_request_error for 4xx but 401/404, as above otherwise.
nlohmann::json ErrorJson(int http_status, absl::string_view message);

// Serializes; invalid UTF-8 (a model may emit any bytes) becomes U+FFFD.
std::string Dump(const nlohmann::json& j);

// The response envelope of one request.
struct ResponseHead {
  std::string id;       // "chatcmpl-..." or "cmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
};

// usage, with prompt_tokens_details.cached_tokens: of the prompt tokens,
// those a slot's cache held (llama-server's prompt cache).
nlohmann::json UsageJson(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens = 0);
// Whole responses (stream = false).
// Choice i of an answer: its text and why it ended.
struct CompletionChoice {
  CompletionChoice() = default;
  CompletionChoice(std::string t, FinishReason f, std::vector<ParsedToolCall> calls = {})
      : text(std::move(t)), finish(f), tool_calls(std::move(calls)) {}

  std::string text;
  FinishReason finish = FinishReason::kStop;
  std::vector<ParsedToolCall> tool_calls;  // chat: message.tool_calls (ids made up here)
  nlohmann::json logprobs;                 // ChatLogprobsJson / AppendCompletionLogprobs'; null: not asked
};

// Logprobs as the API shows them (issue 32). A token's "token" is its piece
// (Tokenizer::TokenToPiece) when that is valid UTF-8 on its own, else
// OpenAI's "bytes:\xNN..." form; "bytes" is always the piece's raw bytes.
// Chat: {"content": [{token, logprob, bytes, top_logprobs: [{token,
// logprob, bytes}, ...]}, ...]}.
nlohmann::json ChatLogprobsJson(const tokenizer::Tokenizer& tok, absl::Span<const generate::TokenLogprobs> entries);
// Completions: appends to *out (null: starts {"tokens", "token_logprobs",
// "top_logprobs", "text_offset"}) `unscored` first when >= 0 (an echoed
// prompt's first token: its logprob and top_logprobs null), then `entries`
// (top_logprobs {token: logprob, ...}). Offsets start at *offset, each
// token's text after the one before, and *offset ends past the last (a
// stream's next chunk continues from it).
void AppendCompletionLogprobs(const tokenizer::Tokenizer& tok, int32_t unscored,
                              absl::Span<const generate::TokenLogprobs> entries, size_t* offset, nlohmann::json* out);
nlohmann::json ChatCompletionJson(const ResponseHead& head, const std::vector<CompletionChoice>& choices,
                                  int64_t prompt_tokens, int64_t completion_tokens,
                                  int64_t cached_tokens = 0);
nlohmann::json CompletionJson(const ResponseHead& head, const std::vector<CompletionChoice>& choices,
                              int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens = 0);
// Stream chunks: `finish` null for a content chunk. The chat stream's first
// chunk carries delta.role = "assistant" (`first`).
// `logprobs` (the builders' above, for this chunk's tokens): choice's
// logprobs; null leaves chat's out and is completions' null.
nlohmann::json ChatChunkJson(const ResponseHead& head, int index, bool first, const std::string& text,
                             const FinishReason* finish, const nlohmann::json& logprobs = nullptr);
nlohmann::json CompletionChunkJson(const ResponseHead& head, int index, const std::string& text,
                                   const FinishReason* finish, const nlohmann::json& logprobs = nullptr);
// A chat stream's chunk of choice `index`'s calls: delta.tool_calls, each
// {index, id, type "function", function {name, arguments}} whole.
nlohmann::json ToolCallsChunkJson(const ResponseHead& head, int index, const std::vector<ParsedToolCall>& calls);
// The usage chunk of stream_options.include_usage: empty choices.
nlohmann::json UsageChunkJson(const ResponseHead& head, bool chat, int64_t prompt_tokens,
                              int64_t completion_tokens, int64_t cached_tokens = 0);

// The Responses API's events for one answer (one assistant message of
// output_text, id "msg_" + the response's): the response object and the
// stream's named events, numbered in order. head.id is "resp_...".
class ResponsesEvents {
 public:
  explicit ResponsesEvents(ResponseHead head);
  // The answer's function calls (ParseToolCalls): function_call items after
  // the message (or alone, without it: with_message false, when the answer
  // has no text and was not streamed), "fc_..." ids and "call_..." call ids.
  void SetCalls(const std::vector<ParsedToolCall>& calls, bool with_message);
  // The whole response (stream = false, and response.completed's): status
  // "completed", or "incomplete" with incomplete_details.reason
  // "max_output_tokens" when the length ended it.
  // usage.input_tokens_details.cached_tokens as UsageJson's.
  nlohmann::json Response(const std::string& text, FinishReason finish, int64_t prompt_tokens,
                          int64_t completion_tokens, int64_t cached_tokens = 0) const;
  // Stream events, each {"type", "sequence_number", ...}: the opening
  // (response.created, response.in_progress, response.output_item.added,
  // response.content_part.added), a text delta, and the close
  // (response.output_text.done, response.content_part.done,
  // response.output_item.done, response.completed or response.incomplete).
  std::vector<nlohmann::json> Open();
  nlohmann::json Delta(const std::string& text);
  std::vector<nlohmann::json> Close(const std::string& text, FinishReason finish, int64_t prompt_tokens,
                                    int64_t completion_tokens, int64_t cached_tokens = 0);
  // An error event ends a failed stream.
  nlohmann::json Error(const absl::Status& status);

 private:
  nlohmann::json Event(const char* type, nlohmann::json fields);
  nlohmann::json Message(const char* status, const std::string* text) const;
  nlohmann::json Output(const char* status, const std::string& text) const;
  std::vector<nlohmann::json> calls_;  // function_call items (SetCalls)
  bool message_ = true;                // the message item is in the output
  ResponseHead head_;
  std::string msg_id_;
  int seq_ = 0;
};

}  // namespace dpl::server
