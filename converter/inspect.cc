#include "converter/inspect.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "formats/dpl_file.h"
#include "formats/dpl_layout.h"
#include "formats/gguf.h"
#include "formats/model_file.h"

namespace dpl::converter {
namespace {

using formats::MetaValue;
using formats::GgufValueType;

using Json = nlohmann::ordered_json;

Json JsonNumber(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

// A JSON value for metadata; arrays are {"elem_type", "count", "head"} with
// at most `max` elements in head. Strings go in as bytes: Dump makes any
// invalid UTF-8 in them U+FFFD.
Json JsonValue(const MetaValue& v, size_t max) {
  switch (v.type) {
    case GgufValueType::kString: return v.bytes;
    case GgufValueType::kBool: return v.scalar_bits != 0;
    case GgufValueType::kF32:
    case GgufValueType::kF64: return JsonNumber(v.AsDouble());
    case GgufValueType::kU64: return v.AsUint();
    case GgufValueType::kArray: {
      Json head = Json::array();
      for (uint64_t i = 0; i < v.count && i < max; ++i) {
        if (v.elem_type == GgufValueType::kString) head.push_back(std::string(v.StringAt(i)));
        else if (v.elem_type == GgufValueType::kF32 || v.elem_type == GgufValueType::kF64)
          head.push_back(JsonNumber(v.FloatAt(i)));
        else head.push_back(v.IntAt(i));
      }
      return Json{{"elem_type", formats::GgufValueTypeName(v.elem_type)},
                  {"count", v.count},
                  {"head", std::move(head)}};
    }
    default: return v.AsInt();
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
  Json json = Json::object();
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
  f.json = {{"container", "gguf"},
            {"version", g.version()},
            {"file_bytes", g.file_size()},
            {"alignment", g.alignment()},
            {"data_offset", g.data_offset()}};
  return f;
}

absl::StatusOr<ContainerFacts> DplFacts(const std::string& path, const InspectOptions& opt) {
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
  f.json = {{"container", "dpl"},
            {"version", h.version},
            {"file_bytes", h.file_bytes},
            {"compressed", h.compressed()},
            {"data_offset", h.data_offset},
            {"data_bytes", h.data_bytes},
            {"data_stored_bytes", h.data_stored_bytes}};
  if (opt.verify_checksums) {
    // Frame by frame for the compressed form: memory stays bounded whatever
    // data_bytes says.
    const int threads = std::max(1u, std::thread::hardware_concurrency());
    DPL_RETURN_IF_ERROR(dpl::Annotate(d.VerifyChecksums(threads), path));
    f.checksum_line = absl::StrCat("checksums: all ", d.tensors().size(), " tensors OK (XXH3-64)");
    f.json["checksums_ok"] = true;
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

// The types the file stores in the dpl layout, by type id.
std::set<formats::GgmlType> DplTypesOf(const formats::ModelFile& model) {
  std::set<formats::GgmlType> types;
  for (const formats::TensorView& t : model.tensors()) {
    if (t.layout == formats::TensorLayout::kDpl) types.insert(t.type);
  }
  return types;
}

// {"type": "q8_0", "planes": [{"field": "qs", "raw_offset": 2, "bytes": 32}, ...],
//  "row_alignment": 16}: one type's dpl row (formats::DplPlanesOf).
Json JsonPlanes(formats::GgmlType type) {
  const formats::DplPlaneSpec spec = formats::DplPlanesOf(type);
  Json planes = Json::array();
  for (uint32_t p = 0; p < spec.n; ++p) {
    planes.push_back({{"field", spec.f[p].name},
                      {"raw_offset", spec.f[p].offset},
                      {"bytes", spec.f[p].bytes}});
  }
  return {{"type", formats::TraitsOf(type).name},
          {"planes", std::move(planes)},
          {"row_alignment", formats::kDplRowAlignment}};
}

void WriteJson(const std::string& path, const formats::ModelFile& model, const ContainerFacts& facts,
               const InspectOptions& opt, std::ostream& out) {
  uint64_t total_bytes;
  const Tallies tally = TallyOf(model, &total_bytes);
  Json j = {{"path", path}};
  j.update(facts.json);
  Json& meta = j["metadata"] = Json::object();
  for (const formats::MetaKV& kv : model.metadata().entries()) {
    meta[kv.key] = {{"type", formats::GgufValueTypeName(kv.value.type)},
                    {"value", JsonValue(kv.value, opt.max_array_elems)}};
  }
  Json& tensors = j["tensors"] = Json::array();
  for (const formats::TensorView& t : model.tensors()) {
    tensors.push_back({{"name", t.name},
                       {"type", formats::TraitsOf(t.type).name},
                       {"layout", formats::TensorLayoutName(t.layout)},
                       {"shape", std::vector<uint64_t>(t.ne.begin(), t.ne.begin() + t.n_dims)},
                       {"row_stride", t.row_stride},
                       {"offset", t.data_offset},
                       {"bytes", t.n_bytes}});
  }
  Json& totals = j["totals"] = Json::array();
  for (const auto& [key, y] : tally) {
    totals.push_back(
        {{"type", key.first}, {"layout", key.second}, {"tensors", y.tensors}, {"bytes", y.bytes}});
  }
  j["total_bytes"] = total_bytes;
  Json& planes = j["planes"] = Json::array();
  for (formats::GgmlType type : DplTypesOf(model)) planes.push_back(JsonPlanes(type));
  // Invalid UTF-8 (a hostile metadata string or key) becomes U+FFFD: the
  // output is always valid JSON.
  out << j.dump(2, ' ', false, Json::error_handler_t::replace) << "\n";
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
  const std::set<formats::GgmlType> dpl_types = DplTypesOf(model);
  if (!dpl_types.empty()) out << "\ndpl planes:\n";
  for (formats::GgmlType type : dpl_types) {
    out << absl::StrFormat("  %s dpl: %s per block, rows padded to %d B\n",
                           formats::TraitsOf(type).name, formats::DplPlanesString(type),
                           formats::kDplRowAlignment);
  }
  if (!facts.checksum_line.empty()) out << "\n" << facts.checksum_line << "\n";
}

}  // namespace

absl::Status Inspect(const std::string& path, const InspectOptions& opt, std::ostream& out) {
  // The index only: nothing is inflated, whatever the data region declares.
  DPL_ASSIGN_OR_RETURN(const std::shared_ptr<formats::ModelFile> model,
                       formats::ModelFile::OpenIndex(path));
  // Container facts, read once more through the specific reader.
  DPL_ASSIGN_OR_RETURN(const ContainerFacts facts,
                       model->container() == formats::Container::kGguf ? GgufFacts(path, opt)
                                                                       : DplFacts(path, opt));
  if (opt.json) {
    WriteJson(path, *model, facts, opt, out);
  } else {
    WriteText(path, *model, facts, opt, out);
  }
  return absl::OkStatus();
}

}  // namespace dpl::converter
