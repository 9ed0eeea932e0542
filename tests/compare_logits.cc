// compare_logits A.f32 B.f32 MAX_REL [ROWS]: RMS(A - B) / RMS(B) over two
// float32 files; exit 0 when below MAX_REL, 1 otherwise (or on bad input, or
// a non-finite value in A). With ROWS, B holds ROWS rows and A is compared by
// its last ROWS rows of the same width (A may hold more rows before them).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

static bool ReadF32(const char* path, std::vector<float>* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  if (bytes.size() % 4 != 0) return false;
  out->resize(bytes.size() / 4);
  std::copy(bytes.begin(), bytes.end(), reinterpret_cast<char*>(out->data()));
  return true;
}

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: compare_logits A.f32 B.f32 MAX_REL [ROWS]\n");
    return 1;
  }
  std::vector<float> a, b;
  if (!ReadF32(argv[1], &a) || !ReadF32(argv[2], &b)) {
    std::fprintf(stderr, "compare_logits: cannot read %s or %s\n", argv[1], argv[2]);
    return 1;
  }
  if (argc == 5) {
    const long rows = std::atol(argv[4]);
    if (rows <= 0 || b.size() % rows != 0 || a.size() < b.size() || a.size() % (b.size() / rows) != 0) {
      std::fprintf(stderr, "compare_logits: %s cannot hold the last %ld rows of %s\n", argv[1], rows, argv[2]);
      return 1;
    }
    a.erase(a.begin(), a.end() - b.size());
  }
  if (a.size() != b.size() || a.empty()) {
    std::fprintf(stderr, "compare_logits: sizes differ (%zu vs %zu floats)\n", a.size(), b.size());
    return 1;
  }
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) {
      std::fprintf(stderr, "compare_logits: non-finite value at %zu\n", i);
      return 1;
    }
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  const double rel = std::sqrt(num / den);
  const double max_rel = std::atof(argv[3]);
  std::printf("relative RMS error %.4f%% (limit %.4f%%)\n", 100 * rel, 100 * max_rel);
  return rel < max_rel ? 0 : 1;
}
