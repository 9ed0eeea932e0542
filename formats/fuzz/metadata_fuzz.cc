// libFuzzer target: the GGUF key/value parser alone (shared by the GGUF
// reader and the .dpl metadata frame). Input: u64 n_kv, then the pairs.
// What parses must answer every typed getter, render, and serialize back to
// bytes that parse to the same table.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "formats/metadata.h"

namespace {

using dpl::formats::ByteReader;
using dpl::formats::Metadata;
using dpl::formats::MetaKV;

void Check(bool ok) {
  if (!ok) std::abort();
}

size_t TouchEveryGetter(const Metadata& meta) {
  size_t sink = 0;
  for (const MetaKV& kv : meta.entries()) {
    Check(meta.Find(kv.key) == &kv.value);
    sink += meta.GetUint(kv.key).ok() + meta.GetInt(kv.key).ok() + meta.GetFloat(kv.key).ok();
    sink += meta.GetBool(kv.key).ok() + meta.GetString(kv.key).ok() + meta.GetArray(kv.key).ok();
    sink += kv.value.DebugString(3).size();
  }
  return sink;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  uint64_t n_kv;
  std::memcpy(&n_kv, data, 8);
  ByteReader r(data + 8, size - 8, 8);
  auto meta = dpl::formats::ParseGgufKv(r, n_kv);
  if (!meta.ok()) return 0;
  size_t sink = TouchEveryGetter(*meta);
  std::string bytes;
  SerializeGgufKv(*meta, bytes);
  Check(bytes.size() == r.pos());
  Check(std::memcmp(bytes.data(), data + 8, bytes.size()) == 0);
  ByteReader again(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  auto back = dpl::formats::ParseGgufKv(again, meta->size());
  Check(back.ok() && back->size() == meta->size() && again.remaining() == 0);
  // Editing keeps the index in step with the order.
  Metadata edited = *meta;
  if (!edited.entries().empty()) {
    const std::string first = edited.entries().front().key;
    Check(edited.Erase(first) && edited.Find(first) == nullptr);
    for (const MetaKV& kv : edited.entries()) Check(edited.Find(kv.key) == &kv.value);
  }
  return sink == 0xFFFFFFFF ? 1 : 0;
}
