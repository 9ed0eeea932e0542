// dpl-server: an OpenAI-compatible HTTP server (llama-server's flag names).
//
//   dpl-server -m MODEL [--host 127.0.0.1] [--port 8080] [-c 4096] [-np 1]
//              [--api-key KEY] [--device cpu] [--queue 64] [-ub 512] ...
//
// It listens at once and loads the model on a background thread (/health
// answers 503 until then). SIGTERM, SIGINT or SIGHUP: stop accepting, end
// the open streams, exit 0.
#include <malloc.h>
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include <cxxopts.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "base/status_macros.h"
#include "cli/cli.h"
#include "formats/model_file.h"
#include "kernels/device_tuning.h"
#include "runtime/cuda/cuda_decoder.h"
#include "runtime/device.h"
#include "runtime/server/cpu_engine.h"
#include "runtime/server/cuda_engine.h"
#include "runtime/server/http_server.h"
#include "runtime/tokenizer/chat_template.h"
#include "runtime/tokenizer/tokenizer.h"

namespace {

void AddFlags(cxxopts::Options& options) {
  options.add_options()
      ("m,model", "model file (GGUF or .dpl)", cxxopts::value<std::string>())
      ("a,alias", "the model's name in the API (default: the file name)", cxxopts::value<std::string>())
      ("host", "address to listen on", cxxopts::value<std::string>()->default_value("127.0.0.1"))
      ("port", "port to listen on (0: any free one, printed)", cxxopts::value<int>()->default_value("8080"))
      ("c,ctx-size",
       "KV cache positions: cuda, one pool all slots share (llama-server's -c with --kv-unified; "
       "one sequence may use all of it); cpu, per slot (0: the model's context; cpu caps it at 4096)",
       cxxopts::value<int64_t>()->default_value("4096"))
      ("parallel", "slots: sequences decoded together (-np)", cxxopts::value<int>()->default_value("1"))
      ("queue", "requests that may wait for a slot; one more gets 503",
       cxxopts::value<int>()->default_value("64"))
      ("api-key", "require Authorization: Bearer KEY (all but /health)", cxxopts::value<std::string>())
      ("strict-model", "refuse a \"model\" other than the alias, the path, the file name or its stem (404)")
      ("no-cors", "no CORS headers: browser pages on other origins cannot call the server")
      ("cors-origin", "comma-separated origins browser pages may call from (default *: any)",
       cxxopts::value<std::string>()->default_value("*"))
      ("device", "cuda (all slots decode in one batched step) or cpu (the float64 reference)",
       cxxopts::value<std::string>()->default_value("cuda"))
      ("t,threads", "CPU threads (0: all)", cxxopts::value<int>()->default_value("0"))
      ("chat-template",
       absl::StrCat("a built-in family renderer, one of ", dpl::tokenizer::ChatTemplateNames(),
                    " (default: the model's own Jinja template, else chatml)"),
       cxxopts::value<std::string>()->default_value(""))
      ("chat-template-file", "a Jinja chat template file, rendered in place of the model's",
       cxxopts::value<std::string>()->default_value(""))
      ("weights-upload",
       "cuda: how the weights reach the GPU: pin, staged or auto (as dpl-run)",
       cxxopts::value<std::string>()->default_value("auto"))
      ("ubatch-size", "prompt tokens fed between two decode steps, all prompts together (-ub)",
       cxxopts::value<int>()->default_value("512"))
      ("header-timeout", "seconds a request's headers may take from their first byte (408 after)",
       cxxopts::value<double>()->default_value("10"))
      ("body-timeout", "seconds a request's body may take after its headers (408 after)",
       cxxopts::value<double>()->default_value("30"))
      ("max-connections", "open connections; at the limit a new one closes the slowest sender",
       cxxopts::value<int>()->default_value("1024"))
      ("chat-content-specials",
       "control-token texts in chat messages (<|im_start|>...) act as tokens, as in llama-server "
       "(default: they stay text, as in OpenAI's API)");
}

absl::Status CheckFlags(const cxxopts::ParseResult& args) {
  auto range = [](absl::string_view flag, double v, double lo, double hi) -> absl::Status {
    if (v >= lo && v <= hi) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", v, " is out of range [", lo, ", ", hi, "]"));
  };
  if (!args.count("model")) return absl::InvalidArgumentError("no model: use -m MODEL");
  DPL_RETURN_IF_ERROR(range("--port", args["port"].as<int>(), 0, 65535));
  DPL_RETURN_IF_ERROR(range("-c", args["ctx-size"].as<int64_t>(), 0, 1 << 24));  // the runtime's kMaxContext
  DPL_RETURN_IF_ERROR(range("-np", args["parallel"].as<int>(), 1, 1024));
  DPL_RETURN_IF_ERROR(range("--queue", args["queue"].as<int>(), 0, 1 << 16));
  DPL_RETURN_IF_ERROR(range("-t", args["threads"].as<int>(), 0, 1024));
  DPL_RETURN_IF_ERROR(range("-ub", args["ubatch-size"].as<int>(), 1, 8192));
  DPL_RETURN_IF_ERROR(
      dpl::runtime::ParseUploadMethod(args["weights-upload"].as<std::string>()).status());
  DPL_RETURN_IF_ERROR(range("--header-timeout", args["header-timeout"].as<double>(), 0.1, 3600));
  DPL_RETURN_IF_ERROR(range("--body-timeout", args["body-timeout"].as<double>(), 0.1, 3600));
  DPL_RETURN_IF_ERROR(range("--max-connections", args["max-connections"].as<int>(), 16, 1 << 20));
  DPL_RETURN_IF_ERROR(dpl::tokenizer::CheckChatTemplateFlags(args["chat-template"].as<std::string>(),
                                                             args["chat-template-file"].as<std::string>()));
  const std::string device = args["device"].as<std::string>();
  if (device != "cpu" && device != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat("unknown device '", device, "' (expected cuda or cpu)"));
  }
  return absl::OkStatus();
}

// The model, its tokenizer and chat template, on the chosen device: cpu, every
// slot a reference model over one mapping; cuda, the runtime's decoder with one
// KV cache region per slot and a step graph per batch-size bucket.
absl::StatusOr<dpl::server::ServedModel> LoadModel(const cxxopts::ParseResult& args) {
  const std::string path = args["model"].as<std::string>();
  const bool cuda = args["device"].as<std::string>() == "cuda";
  // As dpl-run: the CUDA context (and cuBLAS) made while the index, the
  // tokenizer and the template are read, and the host's copy speed measured
  // and the file's pages mapped meanwhile (runtime/device.h).
  std::future<double> device_init = dpl::runtime::StartDeviceInit(args["device"].as<std::string>());
  DPL_ASSIGN_OR_RETURN(std::shared_ptr<dpl::formats::ModelFile> file,
                       cuda ? dpl::formats::ModelFile::OpenIndex(path) : dpl::formats::ModelFile::Open(path));
  dpl::runtime::WeightPrefault prefault = dpl::runtime::StartWeightPrefault(cuda ? file : nullptr);
  dpl::server::ServedModel m;
  DPL_ASSIGN_OR_RETURN(dpl::tokenizer::Tokenizer tok, dpl::tokenizer::Tokenizer::FromMetadata(file->metadata()));
  m.tokenizer = std::make_unique<dpl::tokenizer::Tokenizer>(std::move(tok));
  if (m.tokenizer->has_vocab()) {
    const std::string name = args["chat-template"].as<std::string>();
    std::string jinja;  // --chat-template-file's text
    if (const std::string path = args["chat-template-file"].as<std::string>(); !path.empty()) {
      DPL_ASSIGN_OR_RETURN(jinja, dpl::tokenizer::ReadChatTemplateFile(path));
    }
    auto tmpl = dpl::tokenizer::ChatTemplate::FromMetadata(file->metadata(), name, jinja);
    // Like llama-server: a model without a usable template gets ChatML.
    if (!tmpl.ok() && name.empty() && jinja.empty()) tmpl = dpl::tokenizer::ChatTemplate::FromName("chatml");
    DPL_RETURN_IF_ERROR(tmpl.status());
    m.chat_template = *tmpl;
    std::fprintf(stderr, "dpl-server: chat template: %s\n", m.chat_template->Describe().c_str());
  }
  if (cuda) {
    dpl::runtime::CudaDecoderOptions co;
    co.n_ctx = args["ctx-size"].as<int64_t>();
    co.n_seq = args["parallel"].as<int>();
    // Paged KV: -c positions in one pool of blocks that every slot draws
    // from as it grows (the scheduler hands them out, runtime/kv); a slot
    // may reach the whole pool. DPL_KV_BLOCK sets the block (a power of two,
    // 16 to 1024); 0 keeps a region of -c positions per slot (an A/B).
    co.kv_block = 16;
    if (const char* e = std::getenv("DPL_KV_BLOCK"); e != nullptr) {
      if (!absl::SimpleAtoi(e, &co.kv_block) ||
          (co.kv_block != 0 && (co.kv_block < 16 || co.kv_block > 1024 || (co.kv_block & (co.kv_block - 1)) != 0))) {
        return absl::InvalidArgumentError(
            absl::StrCat("DPL_KV_BLOCK: '", e, "' is not 0 or a power of two from 16 to 1024 (positions)"));
      }
    }
    co.index = file;
    device_init.get();
    // DPL_PROMPT_ONE_LAUNCH=0: a packed pass's chunks through prompt
    // attention one launch a chunk (kernels/tuning.h; an A/B).
    // DPL_GEMM_AHEAD=1: the next matrix's f16 dequant beside this one's
    // GEMM in prompt passes (a probe, kernels/tuning.h), with DPL_GEMM_SMS,
    // DPL_GEMM_AHEAD_CTAS and DPL_GEMM_AHEAD_SIDE_FIRST sharing the SMs out.
    // DPL_MMA_F16_MAX=N: products of 65 to N tokens on the f16 form's wide
    // launch (kernels/tuning.h; 0: dequantize + cuBLAS past 64).
    const char* one_launch = std::getenv("DPL_PROMPT_ONE_LAUNCH");
    const char* ahead = std::getenv("DPL_GEMM_AHEAD");
    const char* f16_max = std::getenv("DPL_MMA_F16_MAX");
    if ((one_launch != nullptr && std::string(one_launch) == "0") || (ahead != nullptr && std::string(ahead) == "1") ||
        (f16_max != nullptr && *f16_max != '\0')) {
      DPL_ASSIGN_OR_RETURN(co.tuning, dpl::kernels::DecodeTuningForDevice());
      co.tuning->prompt_attn_one_launch = one_launch == nullptr || std::string(one_launch) != "0";
      co.tuning->gemm_dequant_ahead = ahead != nullptr && std::string(ahead) == "1";
      if (f16_max != nullptr && *f16_max != '\0' && !absl::SimpleAtoi(f16_max, &co.tuning->mma_f16_max_tokens)) {
        return absl::InvalidArgumentError(absl::StrCat("DPL_MMA_F16_MAX: '", f16_max, "' is not an integer"));
      }
      for (auto [name, field] : {std::pair<const char*, int*>{"DPL_GEMM_SMS", &co.tuning->gemm_ahead_sm_target},
                                 {"DPL_GEMM_AHEAD_CTAS", &co.tuning->gemm_ahead_dequant_ctas}}) {
        const char* e = std::getenv(name);
        if (e != nullptr && *e != '\0' && !absl::SimpleAtoi(e, field)) {
          return absl::InvalidArgumentError(absl::StrCat(name, ": '", e, "' is not an integer"));
        }
      }
      const char* side_first = std::getenv("DPL_GEMM_AHEAD_SIDE_FIRST");
      co.tuning->gemm_ahead_side_first = side_first == nullptr || std::string(side_first) != "0";
    }
    DPL_ASSIGN_OR_RETURN(co.load.method,
                         dpl::runtime::ParseUploadMethod(args["weights-upload"].as<std::string>()));
    co.load.host_copy_gb_per_s = prefault.host_copy_gb_per_s.get();
    DPL_ASSIGN_OR_RETURN(m.engine, dpl::server::CudaEngine::Load(path, co));
    return m;
  }
  dpl::server::CpuEngineOptions eo;
  eo.n_slots = args["parallel"].as<int>();
  eo.n_ctx = args["ctx-size"].as<int64_t>();
  eo.threads = args["threads"].as<int>();
  DPL_ASSIGN_OR_RETURN(m.engine, dpl::server::CpuEngine::Load(file, eo));
  return m;
}

absl::Status Run(const cxxopts::ParseResult& args) {
  DPL_RETURN_IF_ERROR(CheckFlags(args));
  const std::string path = args["model"].as<std::string>();
  dpl::server::ServerOptions o;
  o.host = args["host"].as<std::string>();
  o.port = args["port"].as<int>();
  if (args.count("api-key")) o.api_key = args["api-key"].as<std::string>();
  const std::filesystem::path p(path);
  o.model_id = args.count("alias") ? args["alias"].as<std::string>() : p.filename().string();
  o.model_path = path;
  if (args.count("strict-model")) o.strict_model_names = {o.model_id, path, p.filename().string(), p.stem().string()};
  o.cors_origins = args.count("no-cors") ? std::vector<std::string>{}
                                         : absl::StrSplit(args["cors-origin"].as<std::string>(), ',', absl::SkipEmpty());
  o.n_slots = args["parallel"].as<int>();
  o.scheduler.max_queue = args["queue"].as<int>();
  o.scheduler.prefill_chunk = args["ubatch-size"].as<int>();
  if (const char* e = std::getenv("DPL_PREFILL_BATCH"); e != nullptr && std::string(e) == "0") {
    o.scheduler.batch_prefill = false;
  }
  if (const char* e = std::getenv("DPL_MIXED_STEPS"); e != nullptr && std::string(e) == "0") {
    o.scheduler.mixed_steps = false;
  }
  if (const char* e = std::getenv("DPL_BLOCK_CACHE"); e != nullptr && std::string(e) == "0") {
    o.scheduler.block_cache = false;  // the A/B of blocks that outlive their slots
  }
  if (const char* e = std::getenv("DPL_TRACE_STEPS"); e != nullptr && *e != '\0') {
    auto trace = std::make_shared<std::ofstream>(e);  // a line per engine call (SchedulerOptions::trace)
    if (!trace->is_open()) {
      return absl::InvalidArgumentError(absl::StrCat("DPL_TRACE_STEPS: cannot write '", e, "'"));
    }
    o.scheduler.trace = std::move(trace);
  }
  // The scheduler's KV block pool (issue 30) over the CPU engine's regions,
  // for development (the CUDA engine brings its own pool, -c positions):
  // the CPU engine still reserves -c positions a slot, so a smaller pool
  // saves no memory; it makes requests wait for blocks and preempts the
  // newest as a pool of that size would.
  if (const char* e = std::getenv("DPL_KV_POOL"); e != nullptr) {
    int64_t positions = 0;
    if (!absl::SimpleAtoi(e, &positions) || positions < 0) {
      return absl::InvalidArgumentError(absl::StrCat("DPL_KV_POOL: '", e, "' is not a number of positions"));
    }
    o.scheduler.kv_pool_positions = positions;
  }
  if (const char* e = std::getenv("DPL_KV_BLOCK"); e != nullptr) {
    int block = 0;
    if (!absl::SimpleAtoi(e, &block) || block < 0) {
      return absl::InvalidArgumentError(absl::StrCat("DPL_KV_BLOCK: '", e, "' is not a block size (positions, >= 1)"));
    }
    if (block > 0) o.scheduler.kv_block_size = block;  // 0: the CUDA engine's regions (LoadModel)
  }
  o.http.header_timeout = absl::Seconds(args["header-timeout"].as<double>());
  o.http.body_timeout = absl::Seconds(args["body-timeout"].as<double>());
  o.http.max_connections = args["max-connections"].as<int>();
  o.content_specials = args.count("chat-content-specials") > 0;

  // Large request buffers (bodies, JSON trees, token lists) are mapped and
  // unmapped on their own instead of staying in the heap: with glibc's
  // adaptive threshold a freed 16 MiB body raised it and every later one
  // stayed resident (issue 28: 0.9 -> 3.4 GB over a hostile probe).
  mallopt(M_MMAP_THRESHOLD, 256 << 10);

  // SIGTERM, SIGINT and SIGHUP (the terminal that started it closed) go to
  // one watcher thread (sigwait), never to a handler: each stops the server
  // cleanly, open streams ending with [DONE].
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);  // inherited by every thread made below
  signal(SIGPIPE, SIG_IGN);                            // a gone client is a failed write

  dpl::server::HttpServer server(o);
  DPL_RETURN_IF_ERROR(server.Bind());
  std::fprintf(stderr, "dpl-server: listening on http://%s:%d (loading %s)\n", o.host.c_str(), server.port(),
               path.c_str());
  server.StartLoading([&args, &o] {
    auto m = LoadModel(args);
    if (m.ok() && m->engine->kv_pool_blocks() > 0) {
      const dpl::server::BatchEngine& e = *m->engine;
      std::fprintf(stderr, "dpl-server: %s loaded: %d slots sharing %lld KV positions (blocks of %d) (%s)\n",
                   o.model_id.c_str(), e.n_slots(), static_cast<long long>(e.kv_pool_blocks()) * e.kv_block_size(),
                   e.kv_block_size(), args["device"].as<std::string>().c_str());
    } else if (m.ok()) {
      std::fprintf(stderr, "dpl-server: %s loaded: %d slots of %lld positions (%s)\n", o.model_id.c_str(),
                   m->engine->n_slots(), static_cast<long long>(m->engine->n_ctx()),
                   args["device"].as<std::string>().c_str());
    }
    return m;
  });
  std::atomic<bool> served{false};
  std::thread watcher([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    if (!served) std::fprintf(stderr, "dpl-server: signal %d: stopping\n", sig);
    server.Stop();
  });
  const absl::Status s = server.Serve();
  served = true;
  pthread_kill(watcher.native_handle(), SIGTERM);  // wakes the watcher if no signal came
  watcher.join();
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  dpl::cli::Command cmd("dpl-server", "OpenAI-compatible HTTP server for a GGUF or .dpl model");
  AddFlags(cmd.options());
  cmd.AddSingleDashAlias("-np", "parallel");
  cmd.AddSingleDashAlias("-ub", "ubatch-size");
  if (!cmd.Parse(argc, argv)) return cmd.exit_code();
  const absl::Status s = Run(cmd.args());
  if (!s.ok()) return cmd.Fail(s);
  std::fprintf(stderr, "dpl-server: stopped\n");
  return 0;
}
