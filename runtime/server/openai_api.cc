#include "runtime/server/openai_api.h"

#include <memory>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "runtime/grammar/json_schema.h"

namespace dpl::server {
namespace {

using nlohmann::json;

absl::Status FieldError(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("'", field, "' ", what));
}

// Thrown by the parse callback to stop at a limit.
struct JsonLimit {
  std::string what;
};

// The body as a JSON object, within kMaxJsonDepth and kMaxJsonValues: the
// callback sees every value as it is parsed, so an 8M-deep nesting or a body
// of millions of tiny values stops there instead of building its tree.
absl::StatusOr<json> ParseObject(absl::string_view body) {
  size_t values = 0;
  const json::parser_callback_t limits = [&values](int depth, json::parse_event_t event, json&) {
    if (event == json::parse_event_t::value && ++values > kMaxJsonValues) {
      throw JsonLimit{absl::StrCat("the body holds more than ", kMaxJsonValues, " JSON values")};
    }
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= kMaxJsonDepth) {
      throw JsonLimit{absl::StrCat("the body nests JSON deeper than ", kMaxJsonDepth, " levels")};
    }
    return true;
  };
  json j;
  try {
    j = json::parse(body.begin(), body.end(), limits);
  } catch (const JsonLimit& e) {
    return absl::InvalidArgumentError(e.what);
  } catch (const json::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat("the body is not valid JSON (byte ", e.byte, ")"));
  } catch (const json::exception& e) {  // out_of_range: a number such as 1e400
    return absl::InvalidArgumentError(absl::StrCat("the body is not usable JSON: ", e.what()));
  }
  if (!j.is_object()) return absl::InvalidArgumentError("the body must be a JSON object");
  return j;
}

// The field, or null when absent (JSON null counts as absent, as in OpenAI's API).
const json* Field(const json& obj, const char* name) {
  auto it = obj.find(name);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

// A number in [lo, hi] into *out; absent leaves *out.
absl::Status Number(const json& obj, const char* name, double lo, double hi, float* out) {
  const json* v = Field(obj, name);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number()) return FieldError(name, "must be a number");
  const double d = v->get<double>();
  if (!(d >= lo && d <= hi)) return FieldError(name, absl::StrCat("must be in [", lo, ", ", hi, "]"));
  *out = static_cast<float>(d);
  return absl::OkStatus();
}

// An integer in [lo, hi] into *out; absent leaves *out.
absl::Status Integer(const json& obj, const char* name, int64_t lo, int64_t hi, int64_t* out) {
  const json* v = Field(obj, name);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number_integer()) {
    // 2.0 is an integer to a JavaScript client.
    if (v->is_number_float() && std::nearbyint(v->get<double>()) == v->get<double>() &&
        std::fabs(v->get<double>()) < 9e15) {
      *out = static_cast<int64_t>(v->get<double>());
    } else {
      return FieldError(name, "must be an integer");
    }
  } else if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    *out = u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
               ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(u);
  } else {
    *out = v->get<int64_t>();
  }
  if (*out < lo || *out > hi) return FieldError(name, absl::StrCat("must be in [", lo, ", ", hi, "]"));
  return absl::OkStatus();
}

absl::Status Bool(const json& obj, const char* name, bool* out) {
  const json* v = Field(obj, name);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_boolean()) return FieldError(name, "must be true or false");
  *out = v->get<bool>();
  return absl::OkStatus();
}

// A token id as logit_bias writes it: an object's key (decimal digits:
// "15339") or an array pair's first element (an integer); false otherwise
// (llama-server also takes text there, which it tokenizes; not here).
bool LogitBiasKey(const std::string& key, int32_t* out) {
  if (key.empty() || key.size() > 10) return false;
  int64_t id = 0;
  for (char c : key) {
    if (c < '0' || c > '9') return false;
    id = id * 10 + (c - '0');
  }
  if (id > std::numeric_limits<int32_t>::max()) return false;
  *out = static_cast<int32_t>(id);
  return true;
}
bool LogitBiasId(const json& v, int32_t* out) {
  if (!v.is_number_integer()) return false;
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) return false;
    *out = static_cast<int32_t>(v.get<uint64_t>());
    return true;
  }
  const int64_t id = v.get<int64_t>();
  if (id < 0 || id > std::numeric_limits<int32_t>::max()) return false;
  *out = static_cast<int32_t>(id);
  return true;
}

// A bias: a number in [-100, 100], or false (llama-server's ban: -inf).
bool LogitBiasValue(const json& v, float* out) {
  if (v.is_boolean() && !v.get<bool>()) {
    *out = -std::numeric_limits<float>::infinity();
    return true;
  }
  if (!v.is_number()) return false;
  const double d = v.get<double>();
  if (!(d >= -100.0 && d <= 100.0)) return false;
  *out = static_cast<float>(d);
  return true;
}

// logit_bias: OpenAI's {"ID": bias} or llama-server's [[ID, bias], ...]
// into *out, distinct ids in ascending order, the later of an id given
// twice kept. Ids are checked against the vocabulary at Submit (the model
// is not known here).
absl::Status ParseLogitBias(const json& j, std::vector<LogitBias>* out) {
  const json* lb = Field(j, "logit_bias");
  if (lb == nullptr) return absl::OkStatus();
  if (!lb->is_object() && !lb->is_array()) {
    return FieldError("logit_bias", "must be an object of token ids to biases, or an array of [token id, bias] pairs");
  }
  if (lb->size() > static_cast<size_t>(kernels::kMaxLogitBias)) {
    return FieldError("logit_bias", absl::StrCat("has ", lb->size(), " entries; at most ", kernels::kMaxLogitBias));
  }
  std::map<int32_t, float> bias;  // later wins
  const char* kRange = "must be a number in [-100, 100] or false";
  if (lb->is_object()) {
    for (auto it = lb->begin(); it != lb->end(); ++it) {
      const std::string& key = it.key();
      const json& value = it.value();
      int32_t id = 0;
      float b = 0;
      if (!LogitBiasKey(key, &id)) {
        const std::string shown = key.size() > 32 ? key.substr(0, 32) + "..." : key;
        return FieldError("logit_bias", absl::StrCat("key \"", shown, "\" is not a token id (a non-negative integer)"));
      }
      if (!LogitBiasValue(value, &b)) return FieldError(absl::StrCat("logit_bias.", key), kRange);
      bias[id] = b;
    }
  } else {
    for (size_t i = 0; i < lb->size(); ++i) {
      const json& e = (*lb)[i];
      const std::string field = absl::StrCat("logit_bias[", i, "]");
      if (!e.is_array() || e.size() != 2) return FieldError(field, "must be a [token id, bias] pair");
      int32_t id = 0;
      float b = 0;
      if (!LogitBiasId(e[0], &id)) {
        return FieldError(field + "[0]", "is not a token id (a non-negative integer)");
      }
      if (!LogitBiasValue(e[1], &b)) return FieldError(field + "[1]", kRange);
      bias[id] = b;
    }
  }
  out->clear();
  for (const auto& [id, b] : bias) out->push_back({id, b});
  return absl::OkStatus();
}

// The fields both generation endpoints take.
absl::StatusOr<GenerationParams> ParseParams(const json& j) {
  GenerationParams p;
  if (const json* m = Field(j, "model")) {
    if (!m->is_string()) return FieldError("model", "must be a string");
    p.model = m->get<std::string>();
  }
  int64_t n = 1;
  DPL_RETURN_IF_ERROR(Integer(j, "n", 1, kMaxChoices, &n));
  p.n = static_cast<int>(n);
  // max_completion_tokens is the newer name; either works, the newer wins.
  // -1 is llama.cpp's "until the context ends", the same as not giving it.
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    int64_t v = -2;
    DPL_RETURN_IF_ERROR(Integer(j, name, -1, std::numeric_limits<int32_t>::max(), &v));
    if (v >= -1) p.max_tokens = static_cast<int32_t>(v);
  }
  SamplerParams& s = p.sampling;
  DPL_RETURN_IF_ERROR(Number(j, "temperature", 0, 1e6, &s.temperature));
  DPL_RETURN_IF_ERROR(Number(j, "top_p", 0, 1, &s.top_p));
  DPL_RETURN_IF_ERROR(Number(j, "min_p", 0, 1, &s.min_p));
  DPL_RETURN_IF_ERROR(Number(j, "repeat_penalty", 1e-6, 1e6, &s.repeat_penalty));
  int64_t top_k = s.top_k, last_n = s.repeat_last_n;
  DPL_RETURN_IF_ERROR(Integer(j, "top_k", 0, 1 << 30, &top_k));
  DPL_RETURN_IF_ERROR(Integer(j, "repeat_last_n", 0, 1 << 20, &last_n));
  s.top_k = static_cast<int32_t>(top_k);
  s.repeat_last_n = static_cast<int32_t>(last_n);
  if (Field(j, "seed") != nullptr) {
    int64_t seed = 0;
    DPL_RETURN_IF_ERROR(Integer(j, "seed", std::numeric_limits<int64_t>::min(),
                                std::numeric_limits<int64_t>::max(), &seed));
    // -1 is llama.cpp's "random".
    if (seed != -1) {
      s.seed = static_cast<uint64_t>(seed);
      p.seed_given = true;
    }
  }
  // OpenAI's range; applied over the repeat_last_n window, as llama.cpp does.
  DPL_RETURN_IF_ERROR(Number(j, "presence_penalty", -2, 2, &s.presence_penalty));
  DPL_RETURN_IF_ERROR(Number(j, "frequency_penalty", -2, 2, &s.frequency_penalty));
  DPL_RETURN_IF_ERROR(ParseLogitBias(j, &p.logit_bias));
  if (const json* stop = Field(j, "stop")) {
    if (stop->is_string()) {
      p.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const json& s : *stop) {
        if (!s.is_string()) return FieldError("stop", "must be a string or an array of strings");
        p.stop.push_back(s.get<std::string>());
      }
    } else {
      return FieldError("stop", "must be a string or an array of strings");
    }
  }
  DPL_RETURN_IF_ERROR(Bool(j, "stream", &p.stream));
  DPL_RETURN_IF_ERROR(Bool(j, "ignore_eos", &p.ignore_eos));
  DPL_RETURN_IF_ERROR(Bool(j, "cache_prompt", &p.cache_prompt));
  if (const json* so = Field(j, "stream_options")) {
    if (!so->is_object()) return FieldError("stream_options", "must be an object");
    const absl::Status s = Bool(*so, "include_usage", &p.include_usage);
    if (!s.ok()) return FieldError("stream_options.include_usage", "must be true or false");
  }
  return p;
}

// Chat's logprobs (true: each generated token's) and top_logprobs (0..20
// alternatives), which OpenAI refuses without logprobs true.
absl::Status ParseChatLogprobs(const json& j, GenerationParams* p) {
  bool on = false;
  DPL_RETURN_IF_ERROR(Bool(j, "logprobs", &on));
  int64_t top = 0;
  DPL_RETURN_IF_ERROR(Integer(j, "top_logprobs", 0, generate::kMaxTopLogprobs, &top));
  if (!on && Field(j, "top_logprobs") != nullptr) return FieldError("top_logprobs", "needs 'logprobs': true");
  if (on) p->logprobs = static_cast<int>(top);
  return absl::OkStatus();
}

// Completions' logprobs (0..20 alternatives per token; OpenAI's 5, llama.cpp's more) and echo.
absl::Status ParseCompletionLogprobs(const json& j, GenerationParams* p) {
  int64_t n = -1;
  DPL_RETURN_IF_ERROR(Integer(j, "logprobs", 0, generate::kMaxTopLogprobs, &n));
  p->logprobs = static_cast<int>(n);
  return Bool(j, "echo", &p->echo);
}

// A message's content: a string, or an array of {"type": "text", "text": ...} parts.
absl::StatusOr<std::string> Content(const json& content, size_t i) {
  const std::string field = absl::StrCat("messages[", i, "].content");
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return FieldError(field, "must be a string or an array of text parts");
  std::string text;
  for (const json& part : content) {
    const json* type = part.is_object() ? Field(part, "type") : nullptr;
    const json* t = part.is_object() ? Field(part, "text") : nullptr;
    if (type == nullptr || *type != "text" || t == nullptr || !t->is_string()) {
      return FieldError(field, "parts must be {\"type\": \"text\", \"text\": string} (only text is supported)");
    }
    text += t->get<std::string>();
  }
  return text;
}

// An array of token ids (non-negative int32; the vocabulary is checked later).
absl::StatusOr<std::vector<int32_t>> TokenIds(const json& array, const char* field) {
  std::vector<int32_t> ids;
  for (const json& id : array) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return FieldError(field, "must hold token ids (non-negative integers; one prompt only)");
    }
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return ids;
}

}  // namespace

namespace {

// A tool call's arguments as the template writes them: the JSON text
// re-dumped in Python's spacing, or as given when it is not JSON.
std::string TemplateArguments(const std::string& arguments) {
  nlohmann::ordered_json v = nlohmann::ordered_json::parse(arguments, nullptr, /*allow_exceptions=*/false);
  return v.is_discarded() ? arguments : PythonJson(v);
}

// The key-ordered parse holds the same tools array as the first parse (both
// keep a duplicated key's last value; checked anyway, so no index runs past it).
absl::Status SameTools(const nlohmann::ordered_json& ordered, const json& tools) {
  if (!ordered.is_object() || !ordered.contains("tools") || !ordered.at("tools").is_array() ||
      ordered.at("tools").size() != tools.size()) {
    return FieldError("tools", "could not be read (a duplicated key?)");
  }
  return absl::OkStatus();
}

// tool_choice over the offered tools (r->tools: their template texts;
// `offered`: their names and schemas): "none" drops them all, "auto" keeps
// them, "required" keeps them and forces a call (r->forced_tools), a named
// function (chat: {"type": "function", "function": {"name"}}; Responses,
// flat: {"type": "function", "name"}) keeps that one and forces one call of it.
absl::Status ApplyToolChoice(const json* choice, std::vector<ToolSchema> offered, bool flat, ChatRequest* r) {
  if (choice == nullptr) return absl::OkStatus();
  if (choice->is_string()) {
    const std::string c = choice->get<std::string>();
    if (c != "none" && c != "auto" && c != "required") {
      return FieldError("tool_choice", "must be \"none\", \"auto\", \"required\" or a named function");
    }
    if (c == "none") r->tools.clear();
    if (c == "required" && offered.empty()) return FieldError("tool_choice", "is \"required\", but 'tools' is empty");
    if (c == "required") r->forced_tools = std::move(offered);
    return absl::OkStatus();
  }
  const json* fn = !choice->is_object() ? nullptr : flat ? choice : Field(*choice, "function");
  const json* name = fn != nullptr && fn->is_object() ? Field(*fn, "name") : nullptr;
  if (name == nullptr || !name->is_string()) {
    return FieldError("tool_choice", flat ? "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\": string}"
                                          : "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": string}}");
  }
  for (size_t i = 0; i < offered.size(); ++i) {
    if (offered[i].name == name->get<std::string>()) {
      r->tools = {r->tools[i]};
      r->forced_tools = {std::move(offered[i])};
      r->one_call = true;
      return absl::OkStatus();
    }
  }
  return FieldError("tool_choice", absl::StrCat("names \"", name->get<std::string>(), "\", which is not in 'tools'"));
}

// tools and tool_choice (from the body parsed again keeping key order, as
// the template's tojson writes them) into r->tools.
absl::Status ParseTools(const json& j, const nlohmann::ordered_json& ordered, ChatRequest* r) {
  const json* tools = Field(j, "tools");
  if (tools == nullptr) return absl::OkStatus();
  if (!tools->is_array()) return FieldError("tools", "must be an array");
  DPL_RETURN_IF_ERROR(SameTools(ordered, *tools));
  std::vector<ToolSchema> offered;
  for (size_t i = 0; i < tools->size(); ++i) {
    const json& t = (*tools)[i];
    const std::string field = absl::StrCat("tools[", i, "]");
    const json* type = t.is_object() ? Field(t, "type") : nullptr;
    const json* fn = t.is_object() ? Field(t, "function") : nullptr;
    const json* name = fn != nullptr && fn->is_object() ? Field(*fn, "name") : nullptr;
    if (type == nullptr || *type != "function" || name == nullptr || !name->is_string()) {
      return FieldError(field, "must be {\"type\": \"function\", \"function\": {\"name\": string, ...}}");
    }
    const nlohmann::ordered_json& tool = ordered.at("tools").at(i);
    offered.push_back({name->get<std::string>(), tool.at("function").value("parameters", nlohmann::ordered_json()),
                       field + ".function.parameters"});
    r->tools.push_back(PythonJson(tool));
  }
  return ApplyToolChoice(Field(j, "tool_choice"), std::move(offered), /*flat=*/false, r);
}

// An assistant message's tool_calls: [{id, type, function {name, arguments}}].
absl::StatusOr<std::vector<tokenizer::ToolCall>> ToolCalls(const json& calls, const std::string& field) {
  if (!calls.is_array()) return FieldError(field, "must be an array");
  std::vector<tokenizer::ToolCall> out;
  for (size_t k = 0; k < calls.size(); ++k) {
    const json& c = calls[k];
    const json* fn = c.is_object() ? Field(c, "function") : nullptr;
    const json* name = fn != nullptr && fn->is_object() ? Field(*fn, "name") : nullptr;
    const json* args = fn != nullptr && fn->is_object() ? Field(*fn, "arguments") : nullptr;
    if (name == nullptr || !name->is_string() || (args != nullptr && !args->is_string())) {
      return FieldError(absl::StrCat(field, "[", k, "]"),
                        "must be {\"type\": \"function\", \"function\": {\"name\": string, \"arguments\": string}}");
    }
    const json* id = Field(c, "id");
    out.push_back({name->get<std::string>(), TemplateArguments(args ? args->get<std::string>() : "{}"),
                   id != nullptr && id->is_string() ? id->get<std::string>() : ""});
  }
  return out;
}

// Structured output. `format`: the response_format object (chat) or the
// Responses API's text.format (flat: name and schema beside type), named
// `field`; `ordered`: the same object parsed keeping the client's key order
// (a schema's properties are generated in that order).
absl::Status FormatGrammar(const json& format, const nlohmann::ordered_json& ordered, const std::string& field,
                           bool flat, std::shared_ptr<const grammar::Grammar>* out) {
  const json* type = format.is_object() ? Field(format, "type") : nullptr;
  if (type == nullptr || !type->is_string()) {
    return FieldError(field, "must be an object with a \"type\": text, json_object or json_schema");
  }
  const std::string t = type->get<std::string>();
  if (t == "text") return absl::OkStatus();
  absl::StatusOr<grammar::Grammar> g;
  if (t == "json_object") {
    // llama-server's extension: a "schema" beside it constrains it.
    if (Field(format, "schema") != nullptr) {
      g = grammar::JsonSchemaToGrammar(ordered.at("schema"));
      if (!g.ok()) return FieldError(field + ".schema", absl::StrCat("is not usable: ", g.status().message()));
    } else {
      g = grammar::Grammar::Parse(grammar::JsonObjectGbnf());
      if (!g.ok()) return g.status();
    }
  } else if (t == "json_schema") {
    const std::string holder = flat ? field : field + ".json_schema";
    const json* js = flat ? &format : Field(format, "json_schema");
    if (js == nullptr || !js->is_object()) return FieldError(holder, "must be an object with a \"schema\"");
    const json* schema = Field(*js, "schema");
    if (schema == nullptr) return FieldError(holder + ".schema", "is required");
    if (const json* strict = Field(*js, "strict"); strict != nullptr && !strict->is_boolean()) {
      return FieldError(holder + ".strict", "must be true or false");
    }
    const nlohmann::ordered_json& o = flat ? ordered.at("schema") : ordered.at("json_schema").at("schema");
    g = grammar::JsonSchemaToGrammar(o);
    if (!g.ok()) return FieldError(holder + ".schema", absl::StrCat("is not usable: ", g.status().message()));
  } else {
    return FieldError(field + ".type", absl::StrCat("'", t, "' is not one of text, json_object, json_schema"));
  }
  *out = std::make_shared<const grammar::Grammar>(*std::move(g));
  return absl::OkStatus();
}

// response_format (chat, and completions as vLLM's completions API takes it:
// a client's response_format must never be ignored), text.format
// (Responses), grammar and json_schema (llama-server's; chat and
// completions): at most one constrains the answer.
absl::Status ParseStructuredUnguarded(const json& j, absl::string_view body, bool responses, GenerationParams* p) {
  const json* rf = responses ? nullptr : Field(j, "response_format");
  const json* text = responses ? Field(j, "text") : nullptr;
  const json* tf = text != nullptr && text->is_object() ? Field(*text, "format") : nullptr;
  const json* gbnf = responses ? nullptr : Field(j, "grammar");
  const json* schema = responses ? nullptr : Field(j, "json_schema");
  if (text != nullptr && !text->is_object()) return FieldError("text", "must be an object");
  if (rf == nullptr && tf == nullptr && gbnf == nullptr && schema == nullptr) return absl::OkStatus();
  // Parsed once already within the limits: again, keeping the key order.
  const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(body.begin(), body.end(), nullptr, false);
  if (ordered.is_discarded() || !ordered.is_object()) return absl::InvalidArgumentError("the body could not be read");
  std::shared_ptr<const grammar::Grammar> from_format;
  if (rf != nullptr) {
    DPL_RETURN_IF_ERROR(FormatGrammar(*rf, ordered.at("response_format"), "response_format", false, &from_format));
  }
  if (tf != nullptr) {
    DPL_RETURN_IF_ERROR(FormatGrammar(*tf, ordered.at("text").at("format"), "text.format", true, &from_format));
  }
  if (gbnf != nullptr && schema != nullptr) {
    return FieldError("grammar", "and 'json_schema' are both given: give one");
  }
  if ((gbnf != nullptr || schema != nullptr) && from_format != nullptr) {
    return FieldError(gbnf != nullptr ? "grammar" : "json_schema",
                      "and 'response_format' both constrain the answer: give one");
  }
  if (gbnf != nullptr) {
    if (!gbnf->is_string()) return FieldError("grammar", "must be a string (GBNF)");
    absl::StatusOr<grammar::Grammar> g = grammar::Grammar::Parse(gbnf->get<std::string>());
    if (!g.ok()) return FieldError("grammar", absl::StrCat("is not usable: ", g.status().message()));
    p->grammar = std::make_shared<const grammar::Grammar>(*std::move(g));
  } else if (schema != nullptr) {
    if (!schema->is_object() && !schema->is_boolean()) {
      return FieldError("json_schema", "must be a JSON schema (an object)");
    }
    absl::StatusOr<grammar::Grammar> g = grammar::JsonSchemaToGrammar(ordered.at("json_schema"));
    if (!g.ok()) return FieldError("json_schema", absl::StrCat("is not usable: ", g.status().message()));
    p->grammar = std::make_shared<const grammar::Grammar>(*std::move(g));
  } else {
    p->grammar = std::move(from_format);
  }
  return absl::OkStatus();
}

// parallel_tool_calls, and what a forced tool_choice (r->forced_tools,
// enforced by a grammar) needs: tools, and no other grammar on the answer.
absl::Status ParseForcedCalls(const json& j, bool responses, ChatRequest* r) {
  const json* ptc = Field(j, "parallel_tool_calls");
  if (ptc != nullptr && !ptc->is_boolean()) return FieldError("parallel_tool_calls", "must be true or false");
  if (ptc != nullptr && !ptc->get<bool>()) r->one_call = true;
  const json* choice = Field(j, "tool_choice");
  if (choice != nullptr && (choice->is_object() || *choice == "required") && Field(j, "tools") == nullptr) {
    return FieldError("tool_choice", "forces a tool call, but no 'tools' are given");
  }
  if (r->forced_tools.empty() || r->params.grammar == nullptr) return absl::OkStatus();
  // A grammar/json_schema beside response_format is refused already: the one given made it.
  const char* other = responses                           ? "text.format"
                      : Field(j, "grammar") != nullptr     ? "grammar"
                      : Field(j, "json_schema") != nullptr ? "json_schema"
                                                           : "response_format";
  return FieldError("tool_choice", absl::StrCat("forces a tool call (a grammar of calls), and '", other,
                                                "' constrains the answer too: give one"));
}

absl::Status ParseStructured(const json& j, absl::string_view body, bool responses,
                             GenerationParams* p) {
  try {
    return ParseStructuredUnguarded(j, body, responses, p);
  } catch (const nlohmann::ordered_json::exception& e) {  // the ordered parse differs (duplicate keys)
    return absl::InvalidArgumentError(absl::StrCat("the body's structured-output fields could not be read: ", e.what()));
  }
}

}  // namespace

absl::StatusOr<ChatRequest> ParseChatRequest(absl::string_view body) {
  DPL_ASSIGN_OR_RETURN(const json j, ParseObject(body));
  ChatRequest r;
  DPL_ASSIGN_OR_RETURN(r.params, ParseParams(j));
  DPL_RETURN_IF_ERROR(ParseStructured(j, body, /*responses=*/false, &r.params));
  DPL_RETURN_IF_ERROR(ParseChatLogprobs(j, &r.params));
  const json* messages = Field(j, "messages");
  if (messages == nullptr) return FieldError("messages", "is required");
  if (!messages->is_array() || messages->empty()) return FieldError("messages", "must be a non-empty array");
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string field = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return FieldError(field, "must be an object");
    const json* role = Field(m, "role");
    if (role == nullptr || !role->is_string()) return FieldError(field + ".role", "must be a string");
    std::string r_name = role->get<std::string>();
    if (r_name == "developer") r_name = "system";  // OpenAI's newer name for it
    if (r_name != "system" && r_name != "user" && r_name != "assistant" && r_name != "tool") {
      return FieldError(field + ".role", "must be system, developer, user, assistant or tool");
    }
    const json* content = Field(m, "content");
    std::string text;
    if (content != nullptr) {
      DPL_ASSIGN_OR_RETURN(text, Content(*content, i));
    } else if (r_name != "assistant") {
      return FieldError(field + ".content", "is required");
    }
    std::vector<tokenizer::ToolCall> calls;
    if (const json* tc = Field(m, "tool_calls"); tc != nullptr && r_name == "assistant") {
      DPL_ASSIGN_OR_RETURN(calls, ToolCalls(*tc, field + ".tool_calls"));
    }
    r.messages.push_back({std::move(r_name), std::move(text), std::move(calls)});
    // A tool result's call id, for templates that write it (jinja mode).
    if (const json* id = Field(m, "tool_call_id"); id != nullptr && id->is_string() && r.messages.back().role == "tool") {
      r.messages.back().tool_call_id = id->get<std::string>();
    }
  }
  if (Field(j, "tools") != nullptr) {
    // Parsed once already within the limits: the same text again, keeping
    // the client's key order for the template.
    const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(body.begin(), body.end(), nullptr, false);
    if (ordered.is_discarded()) return FieldError("tools", "could not be read");
    DPL_RETURN_IF_ERROR(ParseTools(j, ordered, &r));
  }
  DPL_RETURN_IF_ERROR(ParseForcedCalls(j, /*responses=*/false, &r));
  r.params.parse_tool_calls = !r.tools.empty();
  return r;
}

std::string PythonJson(const nlohmann::ordered_json& v) {
  if (v.is_object()) {
    std::string out = "{";
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      absl::StrAppend(&out, first ? "" : ", ", nlohmann::ordered_json(it.key()).dump(-1, ' ', false,
                      nlohmann::ordered_json::error_handler_t::replace), ": ", PythonJson(it.value()));
      first = false;
    }
    return out + "}";
  }
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) absl::StrAppend(&out, i ? ", " : "", PythonJson(v[i]));
    return out + "]";
  }
  return v.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

namespace {

using tokenizer::ToolCallFormat;
using ojson = nlohmann::ordered_json;

constexpr absl::string_view kHermesOpen = "<tool_call>";
constexpr absl::string_view kHermesClose = "</tool_call>";
constexpr absl::string_view kPythonTag = "<|python_tag|>";
constexpr absl::string_view kMistralCalls = "[TOOL_CALLS]";
constexpr absl::string_view kMistralArgs = "[ARGS]";
constexpr absl::string_view kMistralCallId = "[CALL_ID]";
// Calls nest no deeper (a deeper "call" is text: no recursion on it).
constexpr int kMaxCallDepth = 64;

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

size_t SkipSpace(absl::string_view text, size_t at) {
  while (at < text.size() && IsSpace(text[at])) ++at;
  return at;
}

std::string Trimmed(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// The JSON object or array that opens at text[at]: kClosed with *end just
// after its closing bracket, kOpen when the text ends first, kBad when a
// bracket does not match or it nests deeper than kMaxCallDepth.
enum class Scan { kClosed, kOpen, kBad };
Scan ScanJson(absl::string_view text, size_t at, size_t* end) {
  std::string open;  // the brackets to close, innermost last
  bool in_string = false, escaped = false;
  for (size_t i = at; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (open.size() >= static_cast<size_t>(kMaxCallDepth)) return Scan::kBad;
      open.push_back(c == '{' ? '}' : ']');
    } else if (c == '}' || c == ']') {
      if (open.empty() || open.back() != c) return Scan::kBad;
      open.pop_back();
      if (open.empty()) {
        *end = i + 1;
        return Scan::kClosed;
      }
    } else if (open.empty()) {
      return Scan::kBad;  // at does not open a bracket
    }
  }
  return Scan::kOpen;
}

// A call's arguments as OpenAI's JSON text: an object as it is, a string
// holding an object parsed, absent as "{}"; anything else is no call.
bool ArgumentsText(const ojson* v, std::string* out) {
  if (v == nullptr) {
    *out = "{}";
    return true;
  }
  if (v->is_string()) {
    const ojson inner = ojson::parse(v->get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (inner.is_discarded() || !inner.is_object()) return false;
    *out = inner.dump(-1, ' ', false, ojson::error_handler_t::replace);
    return true;
  }
  if (!v->is_object()) return false;
  *out = v->dump(-1, ' ', false, ojson::error_handler_t::replace);
  return true;
}

const ojson* Member(const ojson& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

// The JSON value at text[at, end) (a scanned bracket), or discarded.
ojson JsonAt(absl::string_view text, size_t at, size_t end) {
  return ojson::parse(text.begin() + at, text.begin() + end, nullptr, /*allow_exceptions=*/false);
}

std::string MistralCallId() {
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id;
  for (int k = 0; k < 9; ++k) id += kChars[rng() % (sizeof(kChars) - 1)];
  return id;
}

// ---- Hermes (Qwen): <tool_call>{...}</tool_call> ----

ParsedAnswer ParseHermes(const std::string& text) {
  const std::string kOpen(kHermesOpen), kClose(kHermesClose);
  ParsedAnswer a;
  std::string content;
  size_t at = 0;
  for (size_t open; (open = text.find(kOpen, at)) != std::string::npos;) {
    const size_t close = text.find(kClose, open + kOpen.size());
    if (close == std::string::npos) break;
    const std::string inner = text.substr(open + kOpen.size(), close - open - kOpen.size());
    const ojson call = ojson::parse(inner, nullptr, false);
    const bool ok = !call.is_discarded() && call.is_object() && call.contains("name") &&
                    call["name"].is_string() && (!call.contains("arguments") || call["arguments"].is_object());
    if (!ok) break;  // not a call: the rest is content
    content += text.substr(at, open - at);
    a.calls.push_back({call["name"].get<std::string>(),
                       call.contains("arguments") ? call["arguments"].dump() : std::string("{}")});
    at = close + kClose.size();
  }
  content += text.substr(at);
  a.content = Trimmed(content);
  if (a.calls.empty()) a.content = text;  // no call: the answer as it was
  return a;
}

// ---- Llama 3.x: [<|python_tag|>]{"name": ..., "parameters": {...}} ----

// A Llama call object: {"name": string, "parameters" or "arguments",
// "type": "function"?}, nothing else.
bool LlamaCall(const ojson& j, ParsedToolCall* call) {
  if (!j.is_object()) return false;
  const ojson* name = Member(j, "name");
  if (name == nullptr || !name->is_string() || name->get<std::string>().empty()) return false;
  const ojson* params = Member(j, "parameters");
  const ojson* args = Member(j, "arguments");
  if ((params == nullptr) == (args == nullptr)) return false;  // one of them
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "type" ? *it != "function"
                           : it.key() != "name" && it.key() != "parameters" && it.key() != "arguments") {
      return false;
    }
  }
  call->name = name->get<std::string>();
  call->id.clear();
  return ArgumentsText(params != nullptr ? params : args, &call->arguments);
}

// Where a Llama call may begin, at or after `from`: <|python_tag|>, or a '{'
// with only spaces or tabs before it on its line.
size_t FindLlamaStart(absl::string_view text, size_t from) {
  for (size_t i = from; i < text.size(); ++i) {
    if (text[i] == '<' && text.substr(i, kPythonTag.size()) == kPythonTag) return i;
    if (text[i] != '{') continue;
    size_t b = i;
    while (b > 0 && (text[b - 1] == ' ' || text[b - 1] == '\t')) --b;
    if (b == 0 || text[b - 1] == '\n') return i;
  }
  return std::string::npos;
}

// What the text at a start (FindLlamaStart) is.
struct LlamaStart {
  enum Kind {
    kCalls,     // one or more calls, text[start, end)
    kText,      // no call: text[start, end) is text
    kOpen,      // a JSON object not closed yet: maybe a call
    kOpenTag,   // <|python_tag|> and nothing but space after it yet
  } kind;
  size_t end = 0;
  std::vector<ParsedToolCall> calls;
};
LlamaStart AtLlamaStart(absl::string_view text, size_t start) {
  LlamaStart r{LlamaStart::kText, start + 1, {}};
  size_t at = start;
  const bool tagged = text.substr(start, kPythonTag.size()) == kPythonTag;
  if (tagged) {
    r.end = start + kPythonTag.size();
    at = SkipSpace(text, r.end);
    if (at == text.size()) {
      r.kind = LlamaStart::kOpenTag;
      return r;
    }
    if (text[at] != '{') return r;  // a built-in tool's call, or text: kept as text
  }
  // Calls, one after another: "{...}", then ";" or white space.
  for (;;) {
    size_t end = 0;
    const Scan scan = ScanJson(text, at, &end);
    ParsedToolCall call;
    if (scan == Scan::kOpen && r.calls.empty()) r.kind = LlamaStart::kOpen;
    if (scan != Scan::kClosed || !LlamaCall(JsonAt(text, at, end), &call)) {
      // Not a call: the first one's object (or tag) is text; after a call,
      // the calls end here.
      if (r.calls.empty() && !tagged && scan == Scan::kClosed) r.end = end;
      return r;
    }
    r.kind = LlamaStart::kCalls;
    r.calls.push_back(std::move(call));
    r.end = end;
    at = SkipSpace(text, end);
    if (at < text.size() && text[at] == ';') at = SkipSpace(text, at + 1);
    if (at >= text.size() || text[at] != '{') return r;
  }
}

ParsedAnswer ParseLlama3(const std::string& text) {
  ParsedAnswer a;
  std::string content;
  size_t at = 0;
  for (size_t start; (start = FindLlamaStart(text, at)) != std::string::npos;) {
    LlamaStart r = AtLlamaStart(text, start);
    if (r.kind == LlamaStart::kOpen || r.kind == LlamaStart::kOpenTag) break;  // the rest is text
    if (r.kind == LlamaStart::kText) {
      content.append(text, at, r.end - at);
    } else {
      content.append(text, at, start - at);
      for (ParsedToolCall& c : r.calls) a.calls.push_back(std::move(c));
    }
    at = r.end;
  }
  content.append(text, at, std::string::npos);
  a.content = Trimmed(content);
  if (a.calls.empty()) a.content = text;
  return a;
}

// ---- Mistral: [TOOL_CALLS][{...}, ...] or [TOOL_CALLS]name[ARGS]{...} ----

bool MistralCall(const ojson& j, ParsedToolCall* call) {
  if (!j.is_object()) return false;
  const ojson* name = Member(j, "name");
  if (name == nullptr || !name->is_string() || name->get<std::string>().empty()) return false;
  if (!ArgumentsText(Member(j, "arguments"), &call->arguments)) return false;
  call->name = name->get<std::string>();
  const ojson* id = Member(j, "id");
  const bool fits = id != nullptr && id->is_string() && tokenizer::IsMistralCallId(id->get<std::string>());
  call->id = fits ? id->get<std::string>() : MistralCallId();
  return true;
}

// The block after a [TOOL_CALLS] at text[at]: its calls and *end, or false.
bool MistralBlock(absl::string_view text, size_t at, size_t* end, std::vector<ParsedToolCall>* calls) {
  at = SkipSpace(text, at);
  if (at < text.size() && (text[at] == '[' || text[at] == '{')) {
    if (ScanJson(text, at, end) != Scan::kClosed) return false;
    const ojson j = JsonAt(text, at, *end);
    if (j.is_discarded()) return false;
    const ojson list = j.is_array() ? j : ojson::array({j});
    if (list.empty()) return false;
    for (const ojson& one : list) {
      ParsedToolCall call;
      if (!MistralCall(one, &call)) return false;
      calls->push_back(std::move(call));
    }
    return true;
  }
  // name[ARGS]{...}, or name[CALL_ID]id[ARGS]{...}.
  auto word = [&text](size_t from, bool id_chars) {
    size_t e = from;
    while (e < text.size() && (std::isalnum(static_cast<unsigned char>(text[e])) ||
                               (!id_chars && (text[e] == '_' || text[e] == '-' || text[e] == '.')))) {
      ++e;
    }
    return e;
  };
  ParsedToolCall call;
  size_t e = word(at, false);
  if (e == at) return false;
  call.name = std::string(text.substr(at, e - at));
  if (text.substr(e, kMistralCallId.size()) == kMistralCallId) {
    const size_t id_at = e + kMistralCallId.size();
    e = word(id_at, true);
    call.id = std::string(text.substr(id_at, e - id_at));
  }
  if (!tokenizer::IsMistralCallId(call.id)) call.id = MistralCallId();
  if (text.substr(e, kMistralArgs.size()) != kMistralArgs) return false;
  const size_t args = SkipSpace(text, e + kMistralArgs.size());
  if (args >= text.size() || text[args] != '{' || ScanJson(text, args, end) != Scan::kClosed) return false;
  const ojson j = JsonAt(text, args, *end);
  if (j.is_discarded() || !ArgumentsText(&j, &call.arguments)) return false;
  calls->push_back(std::move(call));
  return true;
}

ParsedAnswer ParseMistral(const std::string& text) {
  ParsedAnswer a;
  std::string content;
  size_t at = 0;
  for (size_t mark; (mark = absl::string_view(text).find(kMistralCalls, at)) != std::string::npos;) {
    size_t end = 0;
    std::vector<ParsedToolCall> calls;
    if (!MistralBlock(text, mark + kMistralCalls.size(), &end, &calls)) break;  // the rest is text
    content.append(text, at, mark - at);
    for (ParsedToolCall& c : calls) a.calls.push_back(std::move(c));
    at = end;
  }
  content.append(text, at, std::string::npos);
  a.content = Trimmed(content);
  if (a.calls.empty()) a.content = text;
  return a;
}

// The longest tail of text[from, end) that is a proper prefix of marker.
size_t MarkerTail(const std::string& text, size_t from, absl::string_view marker) {
  size_t keep = std::min(text.size() - from, marker.size() - 1);
  while (keep > 0 && marker.substr(0, keep) != absl::string_view(text).substr(text.size() - keep)) --keep;
  return keep;
}

// How a format writes an answer of calls, as the parsers above read it, in
// GBNF: prefix, each call as open {"name": ..., "<args_key>": {...}} close,
// with sep between calls, then suffix. The spacing is the templates' own.
// The markers are token literals (grammar.h): under a vocabulary where the
// marker is a control token (Mistral's [TOOL_CALLS]; <tool_call> where a
// model has it so), that one token, as the model writes it; under any
// other, the marker's text (Qwen2.5's and Qwen3's <tool_call> are
// user-defined tokens: one piece of text).
// With name_args a call is open name args_marker {...} instead (Mistral
// v11: [TOOL_CALLS]name[ARGS]{...}).
struct CallsLayout {
  std::string prefix, open, args_key, close, sep, suffix;  // GBNF; empty: nothing
  bool name_args = false;
  std::string args_marker;  // GBNF, with name_args
};
CallsLayout LayoutOf(ToolCallFormat format, bool mistral_args) {
  using grammar::GbnfLiteral;
  using grammar::GbnfTokenLiteral;
  if (format == ToolCallFormat::kMistral && mistral_args) {
    CallsLayout l;
    l.open = GbnfTokenLiteral(std::string(kMistralCalls));
    l.name_args = true;
    l.args_marker = GbnfTokenLiteral(std::string(kMistralArgs));
    return l;
  }
  switch (format) {
    case ToolCallFormat::kLlama3: return {"", "", "parameters", "", GbnfLiteral("\n"), ""};
    case ToolCallFormat::kMistral:
      return {absl::StrCat(GbnfTokenLiteral(std::string(kMistralCalls)), " ", GbnfLiteral("[")), "", "arguments", "",
              GbnfLiteral(", "), GbnfLiteral("]")};
    case ToolCallFormat::kHermes:
    case ToolCallFormat::kNone: break;
  }
  return {"", absl::StrCat(GbnfTokenLiteral(std::string(kHermesOpen)), " ", GbnfLiteral("\n")), "arguments",
          absl::StrCat(GbnfLiteral("\n"), " ", GbnfTokenLiteral(std::string(kHermesClose))), GbnfLiteral("\n"), ""};
}

// The GBNF of an answer that is only calls of `tools` (one, or one or more).
absl::StatusOr<std::string> ToolCallsGbnf(const CallsLayout& layout, const std::vector<ToolSchema>& tools,
                                          bool one) {
  grammar::JsonSchemaRules rules;
  std::vector<std::string> calls;
  for (const ToolSchema& t : tools) {
    // No schema: any object (Hermes's and Llama's parsers take no other arguments).
    const ojson schema = t.parameters.is_null() ? ojson{{"type", "object"}} : t.parameters;
    absl::StatusOr<std::string> args = rules.Add(schema, "args");
    if (!args.ok()) return FieldError(t.field, absl::StrCat("is not usable: ", args.status().message()));
    if (layout.name_args) {
      calls.push_back(absl::StrCat(layout.open, " ", grammar::GbnfLiteral(t.name), " ", layout.args_marker, " ", *args));
      continue;
    }
    const std::string name = ojson(t.name).dump(-1, ' ', false, ojson::error_handler_t::replace);
    calls.push_back(absl::StrCat(layout.open, " ",
                                 grammar::GbnfLiteral(absl::StrCat("{\"name\": ", name, ", \"", layout.args_key, "\": ")),
                                 " ", *args, " ", grammar::GbnfLiteral("}"), " ", layout.close));
  }
  const std::string call = absl::StrCat("(", absl::StrJoin(calls, " | "), ")");
  const std::string more = one ? "" : absl::StrCat(" (", layout.sep, " ", call, ")*");  // sep may be empty
  return rules.Gbnf(absl::StrCat(layout.prefix, " ", call, more, " ", layout.suffix));
}

}  // namespace

ParsedAnswer ParseToolCalls(const std::string& text, tokenizer::ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kLlama3: return ParseLlama3(text);
    case ToolCallFormat::kMistral: return ParseMistral(text);
    case ToolCallFormat::kHermes:
    case ToolCallFormat::kNone: break;
  }
  return ParseHermes(text);
}

std::string ToolCallHoldback::Push(const std::string& text) {
  text_ += text;
  if (in_call_) return "";
  std::string out;
  if (format_ != ToolCallFormat::kLlama3) {
    // One marker: held from it to the end.
    const absl::string_view marker = format_ == ToolCallFormat::kMistral ? kMistralCalls : kHermesOpen;
    const size_t at = absl::string_view(text_).find(marker, sent_);
    if (at != std::string::npos) {
      out = text_.substr(sent_, at - sent_);
      sent_ = at;
      in_call_ = true;
      return out;
    }
    const size_t keep = MarkerTail(text_, sent_, marker);
    out = text_.substr(sent_, text_.size() - keep - sent_);
    sent_ = text_.size() - keep;
    return out;
  }
  // Llama: each start is held until it proves a call (held to the end) or
  // text (it goes out, and the search goes on after it).
  if (undecided_ && need_close_ && text.find_first_of("}]") == std::string::npos) return "";
  for (;;) {
    if (undecided_) {
      const LlamaStart r = AtLlamaStart(text_, sent_);
      if (r.kind == LlamaStart::kCalls) {
        in_call_ = true;
        return out;
      }
      if (r.kind != LlamaStart::kText) {
        need_close_ = r.kind == LlamaStart::kOpen;
        return out;
      }
      out.append(text_, sent_, r.end - sent_);
      sent_ = r.end;
      undecided_ = false;
    }
    const size_t start = FindLlamaStart(text_, sent_);
    if (start == std::string::npos) break;
    out.append(text_, sent_, start - sent_);
    sent_ = start;
    undecided_ = true;
  }
  const size_t keep = MarkerTail(text_, sent_, kPythonTag);
  out.append(text_, sent_, text_.size() - keep - sent_);
  sent_ = text_.size() - keep;
  return out;
}

ParsedAnswer ToolCallHoldback::Finish() const { return ParseToolCalls(text_.substr(sent_), format_); }

absl::Status EnforceToolChoice(ToolCallFormat format, ChatRequest* r, bool mistral_args) {
  if (r->forced_tools.empty()) return absl::OkStatus();
  if (format == ToolCallFormat::kNone) {
    return absl::InvalidArgumentError(
        "'tool_choice' forces a tool call, but this model's chat template writes no tools (no tool-call format)");
  }
  DPL_ASSIGN_OR_RETURN(const std::string gbnf,
                       ToolCallsGbnf(LayoutOf(format, mistral_args), r->forced_tools, r->one_call));
  absl::StatusOr<grammar::Grammar> g = grammar::Grammar::Parse(gbnf);
  if (!g.ok()) return absl::InvalidArgumentError(absl::StrCat("'tool_choice': the calls' grammar is not usable: ",
                                                              g.status().message()));
  r->params.grammar = std::make_shared<const grammar::Grammar>(*std::move(g));
  return absl::OkStatus();
}

absl::StatusOr<ChatRequest> ParseResponsesRequest(absl::string_view body) {
  DPL_ASSIGN_OR_RETURN(const json j, ParseObject(body));
  ChatRequest r;
  DPL_ASSIGN_OR_RETURN(r.params, ParseParams(j));
  DPL_RETURN_IF_ERROR(ParseStructured(j, body, /*responses=*/true, &r.params));
  if (r.params.n != 1) return FieldError("n", "is not a Responses API field (one output a response)");
  int64_t max_out = -2;
  DPL_RETURN_IF_ERROR(Integer(j, "max_output_tokens", -1, std::numeric_limits<int32_t>::max(), &max_out));
  if (max_out >= -1) r.params.max_tokens = static_cast<int32_t>(max_out);
  if (const json* ins = Field(j, "instructions"); ins != nullptr && !ins->is_null()) {
    if (!ins->is_string()) return FieldError("instructions", "must be a string");
    r.messages.push_back({"system", ins->get<std::string>()});
  }
  // Tools, flat ({"type": "function", "name", "description", "parameters"}),
  // made the chat form the template writes ({"type": "function",
  // "function": {...the rest, in order}}).
  if (const json* tools = Field(j, "tools"); tools != nullptr) {
    if (!tools->is_array()) return FieldError("tools", "must be an array");
    const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(body.begin(), body.end(), nullptr, false);
    if (ordered.is_discarded()) return FieldError("tools", "could not be read");
    DPL_RETURN_IF_ERROR(SameTools(ordered, *tools));
    std::vector<ToolSchema> offered;
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      const json* type = t.is_object() ? Field(t, "type") : nullptr;
      const json* name = t.is_object() ? Field(t, "name") : nullptr;
      if (type == nullptr || *type != "function" || name == nullptr || !name->is_string()) {
        return FieldError(absl::StrCat("tools[", i, "]"),
                          "must be {\"type\": \"function\", \"name\": string, ...} (only function tools)");
      }
      nlohmann::ordered_json fn = nlohmann::ordered_json::object();
      const nlohmann::ordered_json& flat = ordered.at("tools").at(i);
      offered.push_back({name->get<std::string>(), flat.value("parameters", nlohmann::ordered_json()),
                         absl::StrCat("tools[", i, "].parameters")});
      for (auto it = flat.begin(); it != flat.end(); ++it) {
        if (it.key() != "type" && it.key() != "strict") fn[it.key()] = it.value();
      }
      r.tools.push_back(PythonJson(nlohmann::ordered_json{{"type", "function"}, {"function", fn}}));
    }
    DPL_RETURN_IF_ERROR(ApplyToolChoice(Field(j, "tool_choice"), std::move(offered), /*flat=*/true, &r));
    r.params.parse_tool_calls = !r.tools.empty();
  }
  DPL_RETURN_IF_ERROR(ParseForcedCalls(j, /*responses=*/true, &r));
  const json* input = Field(j, "input");
  if (input == nullptr) return FieldError("input", "is required");
  if (input->is_string()) {
    r.messages.push_back({"user", input->get<std::string>()});
    return r;
  }
  if (!input->is_array() || input->empty()) return FieldError("input", "must be a string or a non-empty array");
  for (size_t i = 0; i < input->size(); ++i) {
    const json& m = (*input)[i];
    const std::string field = absl::StrCat("input[", i, "]");
    if (!m.is_object()) return FieldError(field, "must be an object");
    const json* item = Field(m, "type");
    if (item != nullptr && *item == "function_call") {
      // A call the model made: joins the assistant message before it.
      const json* name = Field(m, "name");
      const json* args = Field(m, "arguments");
      if (name == nullptr || !name->is_string() || (args != nullptr && !args->is_string())) {
        return FieldError(field, "a function_call needs \"name\" and \"arguments\" strings");
      }
      if (r.messages.empty() || r.messages.back().role != "assistant") r.messages.push_back({"assistant", ""});
      const json* call_id = Field(m, "call_id");
      r.messages.back().tool_calls.push_back(
          {name->get<std::string>(), TemplateArguments(args ? args->get<std::string>() : "{}"),
           call_id != nullptr && call_id->is_string() ? call_id->get<std::string>() : ""});
      continue;
    }
    if (item != nullptr && *item == "function_call_output") {
      const json* out = Field(m, "output");
      if (out == nullptr || !out->is_string()) return FieldError(field + ".output", "must be a string");
      r.messages.push_back({"tool", out->get<std::string>()});
      if (const json* call_id = Field(m, "call_id"); call_id != nullptr && call_id->is_string()) {
        r.messages.back().tool_call_id = call_id->get<std::string>();
      }
      continue;
    }
    if (item != nullptr && *item != "message") {
      return FieldError(field + ".type", absl::StrCat("'", item->is_string() ? item->get<std::string>() : item->dump(),
                                                      "' is not supported (message, function_call and "
                                                      "function_call_output items)"));
    }
    const json* role = Field(m, "role");
    if (role == nullptr || !role->is_string()) return FieldError(field + ".role", "must be a string");
    std::string r_name = role->get<std::string>();
    if (r_name == "developer") r_name = "system";
    if (r_name != "system" && r_name != "user" && r_name != "assistant") {
      return FieldError(field + ".role", "must be system, developer, user or assistant");
    }
    const json* content = Field(m, "content");
    if (content == nullptr) return FieldError(field + ".content", "is required");
    std::string text;
    if (content->is_string()) {
      text = content->get<std::string>();
    } else if (content->is_array()) {
      for (const json& part : *content) {
        const json* type = part.is_object() ? Field(part, "type") : nullptr;
        const json* t = part.is_object() ? Field(part, "text") : nullptr;
        if (type == nullptr || (*type != "input_text" && *type != "output_text") || t == nullptr ||
            !t->is_string()) {
          return FieldError(field + ".content",
                            "parts must be {\"type\": \"input_text\" or \"output_text\", \"text\": string} "
                            "(only text is supported)");
        }
        text += t->get<std::string>();
      }
    } else {
      return FieldError(field + ".content", "must be a string or an array of text parts");
    }
    r.messages.push_back({std::move(r_name), std::move(text)});
  }
  return r;
}

absl::StatusOr<CompletionRequest> ParseCompletionRequest(absl::string_view body) {
  DPL_ASSIGN_OR_RETURN(const json j, ParseObject(body));
  CompletionRequest r;
  DPL_ASSIGN_OR_RETURN(r.params, ParseParams(j));
  DPL_RETURN_IF_ERROR(ParseStructured(j, body, /*responses=*/false, &r.params));
  DPL_RETURN_IF_ERROR(ParseCompletionLogprobs(j, &r.params));
  const json* prompt = Field(j, "prompt");
  if (prompt == nullptr) return FieldError("prompt", "is required");
  constexpr const char* kShape =
      "must be a string, a non-empty array of token ids, or a list of strings or of such arrays";
  if (prompt->is_string()) {
    r.prompts.push_back({false, prompt->get<std::string>(), {}});
    return r;
  }
  if (!prompt->is_array() || prompt->empty()) return FieldError("prompt", kShape);
  const json& first = (*prompt)[0];
  if (!first.is_string() && !first.is_array()) {  // one prompt of ids
    CompletionPrompt p;
    p.has_ids = true;
    DPL_ASSIGN_OR_RETURN(p.ids, TokenIds(*prompt, "prompt"));
    r.prompts.push_back(std::move(p));
    return r;
  }
  if (prompt->size() > kMaxCompletionPrompts) {
    return FieldError("prompt", absl::StrCat("lists ", prompt->size(), " prompts; at most ", kMaxCompletionPrompts));
  }
  for (const json& one : *prompt) {
    if (one.is_string()) {
      r.prompts.push_back({false, one.get<std::string>(), {}});
    } else if (one.is_array() && !one.empty()) {
      CompletionPrompt p;
      p.has_ids = true;
      DPL_ASSIGN_OR_RETURN(p.ids, TokenIds(one, "prompt"));
      r.prompts.push_back(std::move(p));
    } else {
      return FieldError("prompt", kShape);
    }
  }
  if (r.prompts.size() * static_cast<size_t>(r.params.n) > static_cast<size_t>(kMaxChoices)) {
    return FieldError("n", absl::StrCat("times the ", r.prompts.size(), " prompts asks for ",
                                        r.prompts.size() * r.params.n, " choices; at most ", kMaxChoices));
  }
  return r;
}

absl::StatusOr<std::pair<std::string, bool>> ParseTokenizeRequest(absl::string_view body) {
  DPL_ASSIGN_OR_RETURN(const json j, ParseObject(body));
  const json* content = Field(j, "content");
  if (content == nullptr || !content->is_string()) return FieldError("content", "must be a string");
  bool add_special = false;
  DPL_RETURN_IF_ERROR(Bool(j, "add_special", &add_special));
  return std::make_pair(content->get<std::string>(), add_special);
}

absl::StatusOr<std::vector<int32_t>> ParseDetokenizeRequest(absl::string_view body) {
  DPL_ASSIGN_OR_RETURN(const json j, ParseObject(body));
  const json* tokens = Field(j, "tokens");
  if (tokens == nullptr || !tokens->is_array()) return FieldError("tokens", "must be an array of token ids");
  return TokenIds(*tokens, "tokens");
}

int HttpStatus(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk: return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition: return 400;
    case absl::StatusCode::kUnauthenticated: return 401;
    case absl::StatusCode::kNotFound: return 404;
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kUnavailable: return 503;
    default: return 500;
  }
}

json ErrorJson(const absl::Status& status) { return ErrorJson(HttpStatus(status), status.message()); }

json ErrorJson(int http_status, absl::string_view message) {
  const int code = http_status;
  const char* type = code == 401   ? "authentication_error"
                     : code == 404 ? "not_found_error"
                     : code == 503 ? "unavailable_error"
                     : code >= 500 ? "server_error"
                                   : "invalid_request_error";
  return {{"error", {{"message", std::string(message)}, {"type", type}, {"code", code}}}};
}

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json UsageJson(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

namespace {
json Envelope(const ResponseHead& head, const char* object) {
  return {{"id", head.id}, {"object", object}, {"created", head.created}, {"model", head.model}};
}

// OpenAI's tool_calls: [{id, type "function", function {name, arguments}}];
// the ids are the parsed call's (Mistral's 9 letters and digits) or made up
// ("call_" and 24 random letters and digits).
json ToolCallsJson(const std::vector<ParsedToolCall>& calls) {
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  json out = json::array();
  for (const ParsedToolCall& c : calls) {
    std::string id = c.id;  // the model's (Mistral's), else made up
    if (id.empty()) {
      id = "call_";
      for (int k = 0; k < 24; ++k) id += kChars[rng() % (sizeof(kChars) - 1)];
    }
    out.push_back({{"id", id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  }
  return out;
}
}  // namespace

namespace {

// Whether `s` is well-formed UTF-8 (no overlongs, surrogates or code
// points past U+10FFFF): a piece that is part of a character is not.
bool IsUtf8(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    uint32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (size_t k = 1; k < len; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 0x2) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

// A token's "token" text and its "bytes".
std::pair<std::string, json> TokenText(const tokenizer::Tokenizer& tok, int32_t id) {
  const std::string piece = tok.TokenToPiece(id);
  json bytes = json::array();
  for (char c : piece) bytes.push_back(static_cast<unsigned char>(c));
  if (IsUtf8(piece)) return {piece, bytes};
  std::string text = "bytes:";
  for (char c : piece) absl::StrAppend(&text, "\\x", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
  return {text, bytes};
}

json ChatTokenJson(const tokenizer::Tokenizer& tok, const generate::TokenLogprob& t) {
  auto [text, bytes] = TokenText(tok, t.token);
  return {{"token", text}, {"logprob", t.logprob}, {"bytes", bytes}};
}

}  // namespace

json ChatLogprobsJson(const tokenizer::Tokenizer& tok, absl::Span<const generate::TokenLogprobs> entries) {
  json content = json::array();
  for (const generate::TokenLogprobs& e : entries) {
    json entry = ChatTokenJson(tok, e.chosen);
    entry["top_logprobs"] = json::array();
    for (const generate::TokenLogprob& t : e.top) entry["top_logprobs"].push_back(ChatTokenJson(tok, t));
    content.push_back(std::move(entry));
  }
  return {{"content", std::move(content)}};
}

void AppendCompletionLogprobs(const tokenizer::Tokenizer& tok, int32_t unscored,
                              absl::Span<const generate::TokenLogprobs> entries, size_t* offset, json* out) {
  if (out->is_null()) {
    *out = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
            {"text_offset", json::array()}};
  }
  auto add = [&](int32_t id, json logprob, json top) {
    const std::string text = TokenText(tok, id).first;
    (*out)["tokens"].push_back(text);
    (*out)["token_logprobs"].push_back(std::move(logprob));
    (*out)["top_logprobs"].push_back(std::move(top));
    (*out)["text_offset"].push_back(*offset);
    *offset += tok.TokenToPiece(id).size();  // the bytes the token adds to the text
  };
  if (unscored >= 0) add(unscored, nullptr, nullptr);
  for (const generate::TokenLogprobs& e : entries) {
    json top = json::object();
    for (const generate::TokenLogprob& t : e.top) top[TokenText(tok, t.token).first] = t.logprob;
    add(e.chosen.token, e.chosen.logprob, std::move(top));
  }
}

json ChatCompletionJson(const ResponseHead& head, const std::vector<CompletionChoice>& choices,
                        int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens) {
  json j = Envelope(head, "chat.completion");
  j["choices"] = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    json message = {{"role", "assistant"}, {"content", choices[i].text}};
    if (!choices[i].tool_calls.empty()) {
      if (choices[i].text.empty()) message["content"] = nullptr;
      message["tool_calls"] = ToolCallsJson(choices[i].tool_calls);
    }
    j["choices"].push_back({{"index", i}, {"message", message}, {"finish_reason", FinishReasonName(choices[i].finish)}});
    if (!choices[i].logprobs.is_null()) j["choices"].back()["logprobs"] = choices[i].logprobs;
  }
  j["usage"] = UsageJson(prompt_tokens, completion_tokens, cached_tokens);
  return j;
}

json CompletionJson(const ResponseHead& head, const std::vector<CompletionChoice>& choices,
                    int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens) {
  json j = Envelope(head, "text_completion");
  j["choices"] = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    j["choices"].push_back({{"index", i},
                            {"text", choices[i].text},
                            {"logprobs", choices[i].logprobs},
                            {"finish_reason", FinishReasonName(choices[i].finish)}});
  }
  j["usage"] = UsageJson(prompt_tokens, completion_tokens, cached_tokens);
  return j;
}

json ToolCallsChunkJson(const ResponseHead& head, int index, const std::vector<ParsedToolCall>& calls) {
  json j = Envelope(head, "chat.completion.chunk");
  json list = ToolCallsJson(calls);
  for (size_t k = 0; k < list.size(); ++k) list[k]["index"] = k;
  j["choices"] = json::array({{{"index", index}, {"delta", {{"tool_calls", list}}}, {"finish_reason", nullptr}}});
  return j;
}

json ChatChunkJson(const ResponseHead& head, int index, bool first, const std::string& text,
                   const FinishReason* finish, const json& logprobs) {
  json j = Envelope(head, "chat.completion.chunk");
  json delta = json::object();
  if (first) delta["role"] = "assistant";
  if (!text.empty() || (first && finish == nullptr)) delta["content"] = text;
  j["choices"] = json::array({{{"index", index},
                               {"delta", delta},
                               {"finish_reason", finish ? json(FinishReasonName(*finish)) : json()}}});
  if (!logprobs.is_null()) j["choices"][0]["logprobs"] = logprobs;
  return j;
}

json CompletionChunkJson(const ResponseHead& head, int index, const std::string& text,
                         const FinishReason* finish, const json& logprobs) {
  json j = Envelope(head, "text_completion");
  j["choices"] = json::array({{{"index", index},
                               {"text", text},
                               {"logprobs", logprobs},
                               {"finish_reason", finish ? json(FinishReasonName(*finish)) : json()}}});
  return j;
}

json UsageChunkJson(const ResponseHead& head, bool chat, int64_t prompt_tokens, int64_t completion_tokens,
                    int64_t cached_tokens) {
  json j = Envelope(head, chat ? "chat.completion.chunk" : "text_completion");
  j["choices"] = json::array();
  j["usage"] = UsageJson(prompt_tokens, completion_tokens, cached_tokens);
  return j;
}

ResponsesEvents::ResponsesEvents(ResponseHead head)
    : head_(std::move(head)), msg_id_(absl::StrCat("msg_", head_.id.substr(head_.id.find('_') + 1))) {}

json ResponsesEvents::Message(const char* status, const std::string* text) const {
  json content = json::array();
  if (text != nullptr) content.push_back({{"type", "output_text"}, {"text", *text}, {"annotations", json::array()}});
  return {{"type", "message"}, {"id", msg_id_}, {"status", status}, {"role", "assistant"}, {"content", content}};
}

void ResponsesEvents::SetCalls(const std::vector<ParsedToolCall>& calls, bool with_message) {
  message_ = with_message;
  const json list = ToolCallsJson(calls);  // ids "call_..."
  calls_.clear();
  for (const json& c : list) {
    std::string id = c["id"].get<std::string>();
    id = absl::StartsWith(id, "call_") ? id.replace(0, 5, "fc_") : "fc_" + id;
    calls_.push_back({{"type", "function_call"}, {"id", id}, {"call_id", c["id"]},
                      {"name", c["function"]["name"]}, {"arguments", c["function"]["arguments"]},
                      {"status", "completed"}});
  }
}

json ResponsesEvents::Output(const char* status, const std::string& text) const {
  json out = json::array();
  if (message_) out.push_back(Message(status, &text));
  for (const json& c : calls_) out.push_back(c);
  return out;
}

json ResponsesEvents::Response(const std::string& text, FinishReason finish, int64_t prompt_tokens,
                               int64_t completion_tokens, int64_t cached_tokens) const {
  const bool cut = finish == FinishReason::kLength;
  return {{"id", head_.id},
          {"object", "response"},
          {"created_at", head_.created},
          {"model", head_.model},
          {"status", cut ? "incomplete" : "completed"},
          {"incomplete_details", cut ? json{{"reason", "max_output_tokens"}} : json()},
          {"error", nullptr},
          {"output", Output(cut ? "incomplete" : "completed", text)},
          {"usage",
           {{"input_tokens", prompt_tokens},
            {"input_tokens_details", {{"cached_tokens", cached_tokens}}},
            {"output_tokens", completion_tokens},
            {"total_tokens", prompt_tokens + completion_tokens}}}};
}

json ResponsesEvents::Event(const char* type, json fields) {
  fields["type"] = type;
  fields["sequence_number"] = seq_++;
  return fields;
}

std::vector<json> ResponsesEvents::Open() {
  json r = {{"id", head_.id}, {"object", "response"}, {"created_at", head_.created}, {"model", head_.model},
            {"status", "in_progress"}, {"output", json::array()}};
  const json part = {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}};
  std::vector<json> out;
  out.push_back(Event("response.created", {{"response", r}}));
  out.push_back(Event("response.in_progress", {{"response", r}}));
  out.push_back(Event("response.output_item.added", {{"output_index", 0}, {"item", Message("in_progress", nullptr)}}));
  out.push_back(Event("response.content_part.added",
                      {{"item_id", msg_id_}, {"output_index", 0}, {"content_index", 0}, {"part", part}}));
  return out;
}

json ResponsesEvents::Delta(const std::string& text) {
  return Event("response.output_text.delta",
               {{"item_id", msg_id_}, {"output_index", 0}, {"content_index", 0}, {"delta", text}});
}

std::vector<json> ResponsesEvents::Close(const std::string& text, FinishReason finish, int64_t prompt_tokens,
                                         int64_t completion_tokens, int64_t cached_tokens) {
  const json whole = Response(text, finish, prompt_tokens, completion_tokens, cached_tokens);
  const json part = {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}};
  std::vector<json> out;
  out.push_back(Event("response.output_text.done",
                      {{"item_id", msg_id_}, {"output_index", 0}, {"content_index", 0}, {"text", text}}));
  out.push_back(Event("response.content_part.done",
                      {{"item_id", msg_id_}, {"output_index", 0}, {"content_index", 0}, {"part", part}}));
  out.push_back(Event("response.output_item.done", {{"output_index", 0}, {"item", whole["output"][0]}}));
  // The calls, each an item of its own after the message: added, its
  // arguments in one delta, done.
  for (size_t k = 0; k < calls_.size(); ++k) {
    json open = calls_[k];
    open["status"] = "in_progress";
    open["arguments"] = "";
    const int index = static_cast<int>(k) + 1;
    const json& id = calls_[k]["id"];
    out.push_back(Event("response.output_item.added", {{"output_index", index}, {"item", open}}));
    out.push_back(Event("response.function_call_arguments.delta",
                        {{"item_id", id}, {"output_index", index}, {"delta", calls_[k]["arguments"]}}));
    out.push_back(Event("response.function_call_arguments.done",
                        {{"item_id", id}, {"output_index", index}, {"arguments", calls_[k]["arguments"]}}));
    out.push_back(Event("response.output_item.done", {{"output_index", index}, {"item", calls_[k]}}));
  }
  out.push_back(Event(finish == FinishReason::kLength ? "response.incomplete" : "response.completed",
                      {{"response", whole}}));
  return out;
}

json ResponsesEvents::Error(const absl::Status& status) {
  return Event("error", {{"code", absl::StatusCodeToString(status.code())}, {"message", std::string(status.message())},
                         {"param", nullptr}});
}

}  // namespace dpl::server
