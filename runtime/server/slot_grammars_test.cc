// SlotGrammars: the vocabulary is built before the first grammar asks for it
// (off the request's path), and a slot's mask follows its grammar.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <thread>

#include <nlohmann/json.hpp>

#include "formats/model_file.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/server/slot_grammars.h"
#include "tests/shared_dir.h"

namespace dpl::server {
namespace {

TEST_CASE("the vocabulary is built at construction, not at the first grammar") {
  auto f = formats::ModelFile::Open(testing::SharedDir() + "/oracle/tiny-qwen2-vocab-q4km.gguf");
  REQUIRE_MESSAGE(f.ok(), f.status().ToString());
  SlotGrammars g(*f, 2, 151936);
  // Built on the constructor's thread (~0.1 s for qwen2's 151,936 tokens);
  // before the change nothing was built until Set.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!g.vocabulary_ready() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(g.vocabulary_ready());

  auto grammar = grammar::JsonSchemaToGrammar(nlohmann::ordered_json::parse(R"({"type": "array", "items": {"type": "integer"}})"));
  REQUIRE(grammar.ok());
  auto shared = std::make_shared<const grammar::Grammar>(*std::move(grammar));
  const absl::Status set = g.Set(1, shared);
  REQUIRE_MESSAGE(set.ok(), set.ToString());
  CHECK_FALSE(g.active(0));
  CHECK(g.active(1));
  auto allowed = g.Allowed(1);
  REQUIRE(allowed.ok());
  int n = 0;
  for (uint32_t w : *allowed) n += __builtin_popcount(w);
  CHECK(n > 0);
  CHECK(n < 100);  // "[" and the few tokens that start with it

  // A model without a vocabulary (ids only): the build's error, at Set.
  auto ids_only = formats::ModelFile::Open(testing::SharedDir() + "/oracle/small-qwen2-q4km.gguf");
  REQUIRE(ids_only.ok());
  SlotGrammars none(*ids_only, 1, 151936);
  CHECK(none.Set(0, shared).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(none.vocabulary_ready());
  CHECK_FALSE(none.active(0));
}

}  // namespace
}  // namespace dpl::server
