// Writes the fuzzers' seed corpora that are made, not copied: issue 11's
// crafted files and their twins (formats/hostile_files.h), and the
// key/value sections of GGUF files for metadata_fuzz.
//
//   write_seeds OUT_DIR [GGUF ...]
// writes OUT_DIR/{gguf,dpl,dpl_compressed,metadata}/NAME...
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "formats/byte_reader.h"
#include "formats/hostile_files.h"
#include "formats/mapped_file.h"
#include "formats/metadata.h"

namespace {

using dpl::formats::hostile::CraftedFile;

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
}

// u64 n_kv followed by the pairs of a GGUF image, or "" when it has none.
std::string KvSection(const uint8_t* data, uint64_t size) {
  if (size < 24) return "";
  uint64_t n_kv;
  std::memcpy(&n_kv, data + 16, 8);
  dpl::formats::ByteReader r(data + 24, size - 24, 24);
  if (!dpl::formats::ParseGgufKv(r, n_kv).ok()) return "";
  return std::string(reinterpret_cast<const char*>(data + 16), 8) +
         std::string(reinterpret_cast<const char*>(data + 24), r.pos());
}

bool IsCompressedDpl(const std::string& image) {
  return image.size() > 12 && (image[12] & dpl::formats::kDplFlagCompressed) != 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: write_seeds OUT_DIR [GGUF ...]\n");
    return 1;
  }
  const std::string out = argv[1];
  int n = 0;
  for (const CraftedFile& f : dpl::formats::hostile::CraftedFiles()) {
    for (const auto& [tag, image] : {std::pair{"bad", &f.bad}, std::pair{"twin", &f.twin}}) {
      const std::string name = f.name + "." + tag + "." + f.ext;
      const std::string dir = f.ext == "gguf" ? "gguf" : IsCompressedDpl(*image) ? "dpl_compressed" : "dpl";
      Write(out + "/" + dir + "/" + name, *image);
      if (f.ext == "gguf") {
        const std::string kv = KvSection(reinterpret_cast<const uint8_t*>(image->data()), image->size());
        if (!kv.empty()) Write(out + "/metadata/" + name + ".kv", kv);
      }
      n += 1;
    }
  }
  for (int i = 2; i < argc; ++i) {
    auto m = dpl::formats::MappedFile::Open(argv[i]);
    if (!m.ok()) continue;
    const std::string kv = KvSection((*m)->data(), (*m)->size());
    const std::string base = std::string(argv[i]).substr(std::string(argv[i]).rfind('/') + 1);
    if (kv.empty()) continue;
    Write(out + "/metadata/" + base + ".kv", kv);
    n += 1;
  }
  std::printf("write_seeds: %d seeds in %s\n", n, out.c_str());
  return 0;
}
