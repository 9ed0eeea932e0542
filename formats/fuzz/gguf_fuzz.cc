// libFuzzer target: the GGUF reader on arbitrary bytes. Any crash, hang,
// sanitizer report or oversized allocation is a finding.
#include <cstddef>
#include <cstdint>

#include "formats/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = dpl::formats::GgufFile::Parse(data, size);
  if (!f.ok()) return 0;
  // Touch everything the parser accepted.
  size_t sink = 0;
  for (const dpl::formats::MetaKV& kv : f->metadata().entries()) {
    sink += kv.value.DebugString(4).size();
  }
  for (const dpl::formats::GgufTensorInfo& t : f->tensors()) {
    const uint8_t* p = f->TensorData(t);
    if (t.n_bytes > 0) sink += p[0] + p[t.n_bytes - 1];
  }
  return sink == 0xFFFFFFFF ? 1 : 0;
}
