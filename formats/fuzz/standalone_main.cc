// main() for the fuzz targets when libFuzzer is not linked (the default,
// gcc build): runs LLVMFuzzerTestOneInput once on each file named on the
// command line. `bazel build //...` so compiles every target, and a finding
// (an artifact of tools/fuzz.sh) replays without clang:
//   bazel-bin/formats/fuzz/dpl_fuzz crash-1234...
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  int ran = 0;
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "%s: cannot read\n", argv[i]);
      return 1;
    }
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    ++ran;
  }
  std::printf("%d inputs ran\n", ran);
  return 0;
}
