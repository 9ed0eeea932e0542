#include "converter/inspect.h"

#include <cmath>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "formats/dpl_file.h"
#include "formats/gguf.h"
#include "formats/model_file.h"

namespace dpl::converter {
namespace {

using formats::MetaValue;
using formats::GgufValueType;

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) out += absl::StrFormat("\\u%04x", c);
        else out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string JsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  return absl::StrFormat("%.17g", v);
}

// A JSON value for metadata; arrays longer than max are summarized as
// {"type":..., "count":..., "head":[...]}.
std::string JsonValue(const MetaValue& v, size_t max) {
  switch (v.type) {
    case GgufValueType::kString: return JsonString(v.bytes);
    case GgufValueType::kBool: return v.scalar_bits ? "true" : "false";
    case GgufValueType::kF32:
    case GgufValueType::kF64: return JsonNumber(v.AsDouble());
    case GgufValueType::kU64: return absl::StrCat(v.AsUint());
    case GgufValueType::kArray: {
      std::vector<std::string> elems;
      for (uint64_t i = 0; i < v.count && i < max; ++i) {
        if (v.elem_type == GgufValueType::kString) elems.push_back(JsonString(v.StringAt(i)));
        else if (v.elem_type == GgufValueType::kF32 || v.elem_type == GgufValueType::kF64)
          elems.push_back(JsonNumber(v.FloatAt(i)));
        else elems.push_back(absl::StrCat(v.IntAt(i)));
      }
      return absl::StrCat("{\"elem_type\": ", JsonString(formats::GgufValueTypeName(v.elem_type)),
                          ", \"count\": ", v.count, ", \"head\": [", absl::StrJoin(elems, ", "),
                          "]}");
    }
    default: return absl::StrCat(v.AsInt());
  }
}

std::string Shape(const formats::TensorView& t) {
  std::vector<uint64_t> dims(t.ne.begin(), t.ne.begin() + t.n_dims);
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

// What the container-specific reader says: one human line, JSON fields, and
// the checksum verdict when asked.
struct ContainerFacts {
  std::string line;
  std::vector<std::pair<std::string, std::string>> json;
  std::string checksum_line;
};

absl::StatusOr<ContainerFacts> GgufFacts(const std::string& path, const InspectOptions& opt) {
  if (opt.verify_checksums) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": GGUF files carry no checksums (--verify-checksums needs a .dpl)"));
  }
  DPL_ASSIGN_OR_RETURN(const formats::GgufFile g, formats::GgufFile::Open(path));
  ContainerFacts f;
  f.line = absl::StrFormat("GGUF v%d, %d bytes, alignment %d, data at %d", g.version(),
                           g.file_size(), g.alignment(), g.data_offset());
  f.json = {{"container", "\"gguf\""},
            {"version", absl::StrCat(g.version())},
            {"file_bytes", absl::StrCat(g.file_size())},
            {"alignment", absl::StrCat(g.alignment())},
            {"data_offset", absl::StrCat(g.data_offset())}};
  return f;
}

absl::StatusOr<ContainerFacts> DplFacts(const std::string& path, const formats::ModelFile& model,
                                        const InspectOptions& opt) {
  DPL_ASSIGN_OR_RETURN(const formats::DplFile d, formats::DplFile::Open(path));
  const formats::DplHeader& h = d.header();
  ContainerFacts f;
  f.line = absl::StrFormat(
      ".dpl v%d%s, %d bytes, data region %d bytes at %d%s", h.version,
      h.compressed() ? " (compressed)" : "", h.file_bytes, h.data_bytes, h.data_offset,
      h.compressed() ? absl::StrFormat(", %d zstd frames of %d bytes, stored %d bytes (ratio %.3f)",
                                       h.n_frames, h.frame_raw_bytes, h.data_stored_bytes,
                                       static_cast<double>(h.data_bytes) / h.data_stored_bytes)
                     : "");
  f.json = {{"container", "\"dpl\""},
            {"version", absl::StrCat(h.version)},
            {"file_bytes", absl::StrCat(h.file_bytes)},
            {"compressed", h.compressed() ? "true" : "false"},
            {"data_offset", absl::StrCat(h.data_offset)},
            {"data_bytes", absl::StrCat(h.data_bytes)},
            {"data_stored_bytes", absl::StrCat(h.data_stored_bytes)}};
  if (opt.verify_checksums) {
    // ModelFile already holds the logical region (inflated if compressed).
    const uint8_t* region = model.tensors().empty()
                                ? nullptr
                                : model.tensors()[0].data - model.tensors()[0].data_offset;
    for (const formats::DplTensorEntry& t : d.tensors()) {
      DPL_RETURN_IF_ERROR(dpl::Annotate(d.VerifyChecksum(t, region), path));
    }
    f.checksum_line = absl::StrCat("checksums: all ", d.tensors().size(), " tensors OK (XXH3-64)");
    f.json.push_back({"checksums_ok", "true"});
  }
  return f;
}

// Bytes per (type, layout).
struct Tally {
  uint64_t tensors = 0, bytes = 0, elements = 0;
};
using Tallies = std::map<std::pair<std::string, std::string>, Tally>;

Tallies TallyOf(const formats::ModelFile& model, uint64_t* total_bytes) {
  Tallies tally;
  *total_bytes = 0;
  for (const formats::TensorView& t : model.tensors()) {
    Tally& y = tally[{std::string(formats::TraitsOf(t.type).name),
                      std::string(formats::TensorLayoutName(t.layout))}];
    ++y.tensors;
    y.bytes += t.n_bytes;
    y.elements += t.ne[0] * t.n_rows;
    *total_bytes += t.n_bytes;
  }
  return tally;
}

void WriteJson(const std::string& path, const formats::ModelFile& model, const ContainerFacts& facts,
               const InspectOptions& opt, std::ostream& out) {
  uint64_t total_bytes;
  const Tallies tally = TallyOf(model, &total_bytes);
  out << "{\n  \"path\": " << JsonString(path) << ",\n";
  for (const auto& [k, v] : facts.json) out << "  \"" << k << "\": " << v << ",\n";
  out << "  \"metadata\": {";
  const char* sep = "\n";
  for (const formats::MetaKV& kv : model.metadata().entries()) {
    out << sep << "    " << JsonString(kv.key) << ": {\"type\": "
        << JsonString(formats::GgufValueTypeName(kv.value.type))
        << ", \"value\": " << JsonValue(kv.value, opt.max_array_elems) << "}";
    sep = ",\n";
  }
  out << "\n  },\n  \"tensors\": [";
  sep = "\n";
  for (const formats::TensorView& t : model.tensors()) {
    out << sep << "    {\"name\": " << JsonString(t.name)
        << ", \"type\": " << JsonString(formats::TraitsOf(t.type).name)
        << ", \"layout\": " << JsonString(formats::TensorLayoutName(t.layout))
        << ", \"shape\": " << Shape(t) << ", \"row_stride\": " << t.row_stride
        << ", \"offset\": " << t.data_offset << ", \"bytes\": " << t.n_bytes << "}";
    sep = ",\n";
  }
  out << "\n  ],\n  \"totals\": [";
  sep = "\n";
  for (const auto& [key, y] : tally) {
    out << sep << "    {\"type\": " << JsonString(key.first)
        << ", \"layout\": " << JsonString(key.second) << ", \"tensors\": " << y.tensors
        << ", \"bytes\": " << y.bytes << "}";
    sep = ",\n";
  }
  out << "\n  ],\n  \"total_bytes\": " << total_bytes << "\n}\n";
}

void WriteText(const std::string& path, const formats::ModelFile& model, const ContainerFacts& facts,
               const InspectOptions& opt, std::ostream& out) {
  uint64_t total_bytes;
  const Tallies tally = TallyOf(model, &total_bytes);
  out << path << ": " << facts.line << "\n\n";
  out << "metadata (" << model.metadata().size() << " keys):\n";
  for (const formats::MetaKV& kv : model.metadata().entries()) {
    out << absl::StrFormat("  %-45s %-7s %s\n", kv.key, formats::GgufValueTypeName(kv.value.type),
                           kv.value.DebugString(opt.max_array_elems));
  }
  out << "\ntensors (" << model.tensors().size() << "):\n";
  out << absl::StrFormat("  %-4s %-34s %-6s %-8s %-22s %10s %12s %12s\n", "#", "name", "type",
                         "layout", "shape", "row_stride", "offset", "bytes");
  for (size_t i = 0; i < model.tensors().size(); ++i) {
    const formats::TensorView& t = model.tensors()[i];
    out << absl::StrFormat("  %-4d %-34s %-6s %-8s %-22s %10d %12d %12d\n", i, t.name,
                           formats::TraitsOf(t.type).name, formats::TensorLayoutName(t.layout),
                           Shape(t), t.row_stride, t.data_offset, t.n_bytes);
  }
  out << "\nbytes by type and layout:\n";
  for (const auto& [key, y] : tally) {
    out << absl::StrFormat("  %-6s %-8s %5d tensors %14d bytes  %6.2f%%  %.3f bits/weight\n",
                           key.first, key.second, y.tensors, y.bytes,
                           total_bytes ? 100.0 * y.bytes / total_bytes : 0.0,
                           y.elements ? 8.0 * y.bytes / y.elements : 0.0);
  }
  out << absl::StrFormat("  total  %5d tensors %14d bytes (%.2f GiB)\n", model.tensors().size(),
                         total_bytes, total_bytes / 1073741824.0);
  if (!facts.checksum_line.empty()) out << "\n" << facts.checksum_line << "\n";
}

}  // namespace

absl::Status Inspect(const std::string& path, const InspectOptions& opt, std::ostream& out) {
  DPL_ASSIGN_OR_RETURN(const std::shared_ptr<formats::ModelFile> model, formats::ModelFile::Open(path));
  // Container facts, read once more through the specific reader.
  DPL_ASSIGN_OR_RETURN(const ContainerFacts facts,
                       model->container() == formats::Container::kGguf
                           ? GgufFacts(path, opt)
                           : DplFacts(path, *model, opt));
  if (opt.json) {
    WriteJson(path, *model, facts, opt, out);
  } else {
    WriteText(path, *model, facts, opt, out);
  }
  return absl::OkStatus();
}

}  // namespace dpl::converter
