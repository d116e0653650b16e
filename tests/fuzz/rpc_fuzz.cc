// pacer_rpc_fuzz: structure-aware fuzzing of pacerd over gRPC, with credentials: pacerd
// never aborts on input (docs/security.md, "Fuzzing").
//
// One pacerd runs in this process (temp data dir, port 0, small quotas, a simulated clock and
// housekeeping only when an input asks for it). Each input is a FuzzInput (rpc_fuzz.proto): a
// short sequence of calls, each to one method of a service pacerd serves (or raw bytes to any
// method), under one credential (worker w0 / w1, chief, agent n0 / n1, server, job token, admin,
// none, forged, or a raw token), sent over a real gRPC channel on loopback. After every call:
//   - the status code is one a client can act on: never UNKNOWN, INTERNAL or DATA_LOSS (a
//     handler that threw, a reply gRPC could not serialize), UNIMPLEMENTED only for a method no
//     service has, DEADLINE_EXCEEDED only for a rendezvous Get (it waits by design);
//   - an OK reply parses as the method's response message;
//   - no error message holds a secret (the job or admin token, a credential's MAC);
// and after every input: pacerd still serves an honest call (the admin's ListDatasets and the
// health check) and this process's RSS is under the limit (--rss-mb, PACER_FUZZ_RSS_MB). A
// crash, an ASan/UBSan report or a failed check aborts with the input in text form on stderr.
//
// With clang and -DPACER_FUZZ=ON this is a libFuzzer binary whose mutator is ProtoMutator
// (LLVMFuzzerCustomMutator: every mutant is a valid FuzzInput). Otherwise main() replays every
// file given (corpus folders or files, binary or text FuzzInputs) and then runs --mutations=N
// mutants of them from --seed=S, so ctest exercises it on any compiler. pacerd starts afresh every
// --restart-every inputs (PACER_FUZZ_RESTART_EVERY), so state builds up across a few inputs but
// quotas filled by one run do not shadow the rest.
#include <google/protobuf/stubs/logging.h>
#include <google/protobuf/text_format.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <grpcpp/impl/codegen/rpc_method.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cmd/pacerd/pacerd.h"
#include "common/auth.h"
#include "common/clock.h"
#include "rpc_fuzz.pb.h"
#include "tests/fuzz/proto_mutator.h"
#include "tests/testing/test_util.h"

namespace pacer::fuzz {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

constexpr size_t kMaxInputBytes = 64 << 10;     // a mutant's serialized size
constexpr int kMaxCalls = 32;                   // calls of one input that are sent
constexpr uint32_t kMaxRepeat = 16;             // Call.repeat
constexpr uint32_t kMaxCopies = 20'000;         // Amplify.copies
constexpr uint32_t kMaxStringBytes = 1 << 20;   // Amplify.string_bytes
constexpr size_t kMaxRequestBytes = 8 << 20;    // one request after amplification
constexpr size_t kMaxInputSentBytes = 64 << 20; // everything one input sends
constexpr uint32_t kMaxAdvanceMs = 120'000;

// The services pacerd registers (cmd/pacerd/pacerd.cc, Pacerd::Start), in that order.
const char* const kServices[] = {"pacer.ShardingService", "pacer.Monitor", "pacer.ControllerService",
                                 "pacer.AgentService", "pacer.ContentionSwitch", "pacer.Operator",
                                 "pacer.Rendezvous"};
// Raw calls may also go to these (no request message of ours): gRPC's health check, which
// pacerd serves, and a method no service has.
const char* const kExtraMethods[] = {"/grpc.health.v1.Health/Check", "/pacer.ShardingService/NoSuchMethod",
                                     "/no.such.Service/Call"};

std::string SnakeCase(const std::string& camel) {
  std::string out;
  for (char c : camel) {
    if (std::isupper(static_cast<unsigned char>(c))) {
      if (!out.empty()) out += '_';
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else {
      out += c;
    }
  }
  return out;
}

struct Method {
  std::string path;                            // "/pacer.ShardingService/FetchShard"
  const Descriptor* response = nullptr;        // null: an extra method (raw calls only)
  const FieldDescriptor* field = nullptr;      // its field in Call.request
  bool waits = false;                          // may end in DEADLINE_EXCEEDED by design
  bool known = true;                           // served by pacerd
};

// Every method of every service pacerd serves, with its field in Call.request. Aborts when a
// method has no field there (rpc_fuzz.proto must list it) or the field's type is not the
// method's request.
std::vector<Method> MethodTable() {
  const auto* pool = google::protobuf::DescriptorPool::generated_pool();
  const Descriptor* call = Call::descriptor();
  std::vector<Method> methods;
  for (const char* name : kServices) {
    const auto* service = pool->FindServiceByName(name);
    if (service == nullptr) {
      std::fprintf(stderr, "pacer_rpc_fuzz: service %s is not linked in\n", name);
      std::abort();
    }
    for (int i = 0; i < service->method_count(); ++i) {
      const auto* m = service->method(i);
      const std::string field_name = SnakeCase(service->name()) + "_" + SnakeCase(m->name());
      const FieldDescriptor* f = call->FindFieldByName(field_name);
      if (f == nullptr || f->message_type() != m->input_type()) {
        std::fprintf(stderr, "pacer_rpc_fuzz: %s has no field '%s %s' in rpc_fuzz.proto's Call\n",
                     m->full_name().c_str(), m->input_type()->full_name().c_str(), field_name.c_str());
        std::abort();
      }
      Method entry;
      entry.path = "/" + service->full_name() + "/" + m->name();
      entry.response = m->output_type();
      entry.field = f;
      entry.waits = m->full_name() == "pacer.Rendezvous.Get";
      methods.push_back(entry);
    }
  }
  for (const char* path : kExtraMethods) {
    Method entry;
    entry.path = path;
    entry.known = std::string(path) == kExtraMethods[0];
    methods.push_back(entry);
  }
  return methods;
}

int64_t RssMb() {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    if (key == "VmRSS:") {
      int64_t kb = 0;
      in >> kb;
      return kb / 1024;
    }
    std::getline(in, key);
  }
  return -1;
}

std::string Flatten(const grpc::ByteBuffer& bb) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!bb.Dump(&slices).ok()) return out;
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// Depth-first, in field order: the string fields that are set and the repeated fields that hold
// an element (Amplify.field picks among them).
struct Growable {
  Message* msg;
  const FieldDescriptor* field;
};
void CollectGrowable(Message* msg, int depth, std::vector<Growable>* out) {
  const Reflection* r = msg->GetReflection();
  const Descriptor* d = msg->GetDescriptor();
  for (int i = 0; i < d->field_count() && depth < 8; ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) {
      const int n = r->FieldSize(*msg, f);
      if (n > 0) out->push_back({msg, f});
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE)
        for (int j = 0; j < n && j < 4; ++j) CollectGrowable(r->MutableRepeatedMessage(msg, f, j), depth + 1, out);
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
      if (!r->GetString(*msg, f).empty()) out->push_back({msg, f});
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && r->HasField(*msg, f)) {
      CollectGrowable(r->MutableMessage(msg, f), depth + 1, out);
    }
  }
}

void ApplyAmplify(const Amplify& a, Message* request) {
  std::vector<Growable> fields;
  CollectGrowable(request, 0, &fields);
  if (fields.empty()) return;
  const Growable& g = fields[a.field() % fields.size()];
  const Reflection* r = g.msg->GetReflection();
  const size_t room = kMaxRequestBytes > request->ByteSizeLong() ? kMaxRequestBytes - request->ByteSizeLong() : 0;
  if (!g.field->is_repeated()) {
    std::string s = r->GetString(*g.msg, g.field);
    const size_t want = std::min<size_t>({a.string_bytes(), kMaxStringBytes, s.size() + room});
    if (want > s.size()) {
      const std::string unit = s.empty() ? std::string("x") : s;
      while (s.size() < want) s.append(unit, 0, std::min(unit.size(), want - s.size()));
      r->SetString(g.msg, g.field, std::move(s));
    }
    return;
  }
  const int n = r->FieldSize(*g.msg, g.field);
  uint32_t copies = std::min(a.copies(), kMaxCopies);
  if (g.field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    const Message& last = r->GetRepeatedMessage(*g.msg, g.field, n - 1);
    const size_t each = last.ByteSizeLong() + 4;
    copies = static_cast<uint32_t>(std::min<size_t>(copies, room / each));
    std::unique_ptr<Message> copy(last.New());
    copy->CopyFrom(last);
    for (uint32_t i = 0; i < copies; ++i) r->AddMessage(g.msg, g.field)->CopyFrom(*copy);
    return;
  }
  copies = static_cast<uint32_t>(std::min<size_t>(copies, room / 10));
  for (uint32_t i = 0; i < copies; ++i) {
    switch (g.field->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32: r->AddInt32(g.msg, g.field, r->GetRepeatedInt32(*g.msg, g.field, n - 1)); break;
      case FieldDescriptor::CPPTYPE_INT64: r->AddInt64(g.msg, g.field, r->GetRepeatedInt64(*g.msg, g.field, n - 1)); break;
      case FieldDescriptor::CPPTYPE_UINT32: r->AddUInt32(g.msg, g.field, r->GetRepeatedUInt32(*g.msg, g.field, n - 1)); break;
      case FieldDescriptor::CPPTYPE_UINT64: r->AddUInt64(g.msg, g.field, r->GetRepeatedUInt64(*g.msg, g.field, n - 1)); break;
      case FieldDescriptor::CPPTYPE_DOUBLE: r->AddDouble(g.msg, g.field, r->GetRepeatedDouble(*g.msg, g.field, n - 1)); break;
      case FieldDescriptor::CPPTYPE_FLOAT: r->AddFloat(g.msg, g.field, r->GetRepeatedFloat(*g.msg, g.field, n - 1)); break;
      case FieldDescriptor::CPPTYPE_BOOL: r->AddBool(g.msg, g.field, r->GetRepeatedBool(*g.msg, g.field, n - 1)); break;
      case FieldDescriptor::CPPTYPE_ENUM: r->AddEnumValue(g.msg, g.field, r->GetRepeatedEnumValue(*g.msg, g.field, n - 1)); break;
      case FieldDescriptor::CPPTYPE_STRING: {
        const std::string last = r->GetRepeatedString(*g.msg, g.field, n - 1);
        if (last.size() * (i + 1) > room) return;
        r->AddString(g.msg, g.field, last);
        break;
      }
      default: return;
    }
  }
}

// Integer and id fields of OK replies, by field name, the last value seen (Call.from_replies).
class ReplyMemory {
 public:
  // Nested messages first, then this level's fields: the shallowest value of a name wins (a
  // RegisterWorker reply's own incarnation, not that of a lease it lists).
  void Record(const Message& msg, int depth = 0) {
    const Reflection* r = msg.GetReflection();
    std::vector<const FieldDescriptor*> fields;
    r->ListFields(msg, &fields);
    for (const FieldDescriptor* f : fields) {
      if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE || depth >= 6) continue;
      if (!f->is_repeated()) {
        Record(r->GetMessage(msg, f), depth + 1);
      } else if (r->FieldSize(msg, f) > 0) {
        Record(r->GetRepeatedMessage(msg, f, r->FieldSize(msg, f) - 1), depth + 1);
      }
    }
    for (const FieldDescriptor* f : fields) {
      if (f->is_repeated()) continue;
      switch (f->cpp_type()) {
        case FieldDescriptor::CPPTYPE_UINT64: ints_[f->name()] = r->GetUInt64(msg, f); break;
        case FieldDescriptor::CPPTYPE_INT64: ints_[f->name()] = static_cast<uint64_t>(r->GetInt64(msg, f)); break;
        case FieldDescriptor::CPPTYPE_UINT32: ints_[f->name()] = r->GetUInt32(msg, f); break;
        case FieldDescriptor::CPPTYPE_STRING:
          if (f->name().size() > 3 && f->name().substr(f->name().size() - 3) == "_id")
            strings_[f->name()] = r->GetString(msg, f);
          break;
        default: break;
      }
    }
  }
  void Fill(Message* msg, int depth = 0) const {
    const Reflection* r = msg->GetReflection();
    const Descriptor* d = msg->GetDescriptor();
    for (int i = 0; i < d->field_count(); ++i) {
      const FieldDescriptor* f = d->field(i);
      if (f->is_repeated()) {
        if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && depth < 6)
          for (int j = 0; j < r->FieldSize(*msg, f) && j < 8; ++j) Fill(r->MutableRepeatedMessage(msg, f, j), depth + 1);
        continue;
      }
      auto it = ints_.find(f->name());
      switch (f->cpp_type()) {
        case FieldDescriptor::CPPTYPE_UINT64: if (it != ints_.end()) r->SetUInt64(msg, f, it->second); break;
        case FieldDescriptor::CPPTYPE_INT64: if (it != ints_.end()) r->SetInt64(msg, f, static_cast<int64_t>(it->second)); break;
        case FieldDescriptor::CPPTYPE_UINT32: if (it != ints_.end()) r->SetUInt32(msg, f, static_cast<uint32_t>(it->second)); break;
        case FieldDescriptor::CPPTYPE_STRING: {
          auto s = strings_.find(f->name());
          if (s != strings_.end() && r->GetString(*msg, f).empty()) r->SetString(msg, f, s->second);
          break;
        }
        case FieldDescriptor::CPPTYPE_MESSAGE:
          if (depth < 6 && r->HasField(*msg, f)) Fill(r->MutableMessage(msg, f), depth + 1);
          break;
        default: break;
      }
    }
  }
  void Clear() { ints_.clear(); strings_.clear(); }

 private:
  std::map<std::string, uint64_t> ints_;
  std::map<std::string, std::string> strings_;
};

struct Options {
  int restart_every = 200;
  int64_t rss_mb = 2048;
  bool verbose = false;
};

Options OptionsFromEnv() {
  Options o;
  if (const char* v = std::getenv("PACER_FUZZ_RESTART_EVERY")) o.restart_every = std::max(1, std::atoi(v));
  if (const char* v = std::getenv("PACER_FUZZ_RSS_MB")) o.rss_mb = std::max<int64_t>(64, std::atoll(v));
  o.verbose = std::getenv("PACER_FUZZ_VERBOSE") != nullptr;
  return o;
}

// The in-process pacerd and everything that talks to it; one for the whole run.
class Target {
 public:
  explicit Target(Options options) : options_(options), methods_(MethodTable()) {}
  ~Target() { Stop(); }

  void RunInput(const FuzzInput& input);
  void PrintStats() const;
  const Options& options() const { return options_; }
  Options& mutable_options() { return options_; }

 private:
  void Start();
  void Stop();
  void RunCall(const Call& call, size_t* sent);
  void RunJob(const Job& job);
  // Sends `request` to the method at `path` with `token`, checks the status; the reply if OK.
  std::string SendChecked(const std::string& path, const Message& request, const std::string& token);
  grpc::Status Send(const Method& m, const std::string& body, const std::string& token, std::string* reply);
  void CheckStatus(const Method& m, const grpc::Status& s, const std::string& reply);
  void CheckHonestCall();
  [[noreturn]] void Fail(const std::string& what);
  std::string TokenFor(const Call& call) const;

  Options options_;
  std::vector<Method> methods_;
  std::unique_ptr<testing::TempDir> dir_;
  std::unique_ptr<SimulatedClock> clock_;
  std::unique_ptr<Pacerd> pacerd_;
  std::shared_ptr<grpc::Channel> channel_;
  std::vector<std::string> tokens_;   // by Credential
  std::vector<std::string> secrets_;  // never in an error message
  ReplyMemory replies_;
  const FuzzInput* current_ = nullptr;
  std::vector<FuzzInput> since_start_;  // the inputs run on this pacerd, for Fail()
  int inputs_since_start_ = 0;
  int starts_ = 0;
  std::string policy_;  // the policy file of this start (policies/), empty for none
  uint64_t inputs_ = 0, calls_ = 0;
  std::map<int, uint64_t> codes_;
  std::map<std::string, uint64_t> job_steps_;  // a played job's last step per worker
  int64_t max_rss_mb_ = 0;
  std::chrono::steady_clock::time_point began_ = std::chrono::steady_clock::now();
};

// Small quotas, so that a few calls reach each limit.
void SetSmallQuotas(PacerdOptions* o) {
  o->sharding.max_datasets = 8;
  o->sharding.max_files_total = 4'096;
  o->sharding.max_workers = 64;
  o->agents.max_agents = 16;
  o->agents.max_workers_per_agent = 64;
  o->agents.max_exits_per_heartbeat = 64;
  o->agents.max_acks_per_heartbeat = 64;
  o->rendezvous.max_bytes = 2 << 20;
  o->rendezvous.max_value_bytes = 64 << 10;
  o->rendezvous.max_key_bytes = 1024;
  o->rendezvous.max_keys_per_get = 64;
  o->rendezvous.max_waiting_gets = 32;
  o->monitor.max_workers = 256;
  o->monitor.max_servers = 64;
  o->monitor.max_nodes = 256;
}

void Target::Start() {
  dir_ = std::make_unique<testing::TempDir>();
  clock_ = std::make_unique<SimulatedClock>(1'700'000'000'000);
  PacerdOptions o;
  o.data_dir = dir_->Sub("data");
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "";
  o.housekeeping = false;  // Call.advance_ms runs a step
  o.sharding.sync = false;
  o.reconciler.interval_ms = 1000;
  o.agents.id_nonce = 1;
  // Small quotas, so that a few calls reach each limit; PACER_FUZZ_QUOTAS=default keeps
  // production's (cmd/pacerd/pacerd.h), to look for what one client can do to a real pacerd.
  const char* quotas = std::getenv("PACER_FUZZ_QUOTAS");
  if (quotas == nullptr || std::string(quotas) != "default") SetSmallQuotas(&o);
  // Each start runs the next of these policies, so the controller's decisions and the actions
  // pacerd carries out (plans, exclusions, allocations, agent commands) are fuzzed too.
  static const char* const kPolicies[] = {"", "non-dedicated.yaml", "dedicated.yaml",
                                          "baseline-backup-workers.yaml", "baseline-lb-bsp.yaml",
                                          "baseline-timeout-relaunch.yaml"};
  const char* policy = std::getenv("PACER_FUZZ_POLICY");  // replaying a failure: its policy
  if (policy == nullptr) policy = kPolicies[starts_ % (sizeof kPolicies / sizeof *kPolicies)];
  policy_ = policy;
  if (*policy) o.policy_file = std::string(PACER_POLICY_DIR) + "/" + policy;
  auto d = Pacerd::Start(o, clock_.get());
  if (!d.ok()) {
    std::fprintf(stderr, "pacer_rpc_fuzz: pacerd did not start: %s\n", d.status().ToString().c_str());
    std::abort();
  }
  pacerd_ = std::move(*d);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);  // see every reply pacerd sends, however large
  args.SetMaxSendMessageSize(-1);
  channel_ = grpc::CreateCustomChannel(pacerd_->address(), grpc::InsecureChannelCredentials(), args);
  const std::string& job = pacerd_->job_token();
  auto mint = [&](CredentialKind kind, const char* id) { return MintCredential(job, kind, id).value(); };
  std::string forged = mint(CredentialKind::kWorker, "w0");
  forged.back() = forged.back() == '0' ? '1' : '0';
  tokens_ = {mint(CredentialKind::kWorker, "w0"), mint(CredentialKind::kWorker, "w1"),
             mint(CredentialKind::kChief, "w0"),  mint(CredentialKind::kAgent, "n0"),
             mint(CredentialKind::kAgent, "n1"),  mint(CredentialKind::kServer, "ps0"),
             job, pacerd_->admin_token(), "", forged};
  secrets_ = {job, pacerd_->admin_token()};
  for (int i = 0; i < 6; ++i) secrets_.push_back(tokens_[i].substr(tokens_[i].rfind(':') + 1));
  replies_.Clear();
  job_steps_.clear();
  since_start_.clear();
  inputs_since_start_ = 0;
  ++starts_;
}

void Target::Stop() {
  channel_.reset();
  if (pacerd_) pacerd_->Shutdown();
  pacerd_.reset();
  dir_.reset();
}

std::string Target::TokenFor(const Call& call) const {
  if (!call.raw_token().empty()) {
    // gRPC's client refuses metadata values outside printable ASCII: keep the token sendable.
    std::string t = call.raw_token().substr(0, 4096);
    for (char& c : t) c = static_cast<char>(0x21 + static_cast<unsigned char>(c) % 94);
    return t;
  }
  const int i = static_cast<int>(call.credential());
  return i >= 0 && i < static_cast<int>(tokens_.size()) ? tokens_[i] : tokens_[0];
}

// Prints the failure and the input, and writes every input this pacerd ran (state builds up
// across them) to PACER_FUZZ_FAILURE_DIR (default: pacer_rpc_fuzz.failure in the working dir),
// one text file each: `pacer_rpc_fuzz --restart-every=100000 DIR` replays them on a fresh pacerd.
void Target::Fail(const std::string& what) {
  std::string text;
  if (current_) google::protobuf::TextFormat::PrintToString(*current_, &text);
  if (text.size() > 64 << 10) text.resize(64 << 10);
  const char* env = std::getenv("PACER_FUZZ_FAILURE_DIR");
  const std::string dir = env ? env : "pacer_rpc_fuzz.failure";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir, ec);
  for (size_t i = 0; i < since_start_.size(); ++i) {
    std::string one;
    google::protobuf::TextFormat::PrintToString(since_start_[i], &one);
    char name[32];
    std::snprintf(name, sizeof name, "/%05zu.textproto", i);
    std::ofstream(dir + name) << "# pacer_rpc_fuzz input " << i << " since pacerd started\n" << one;
  }
  std::fprintf(stderr,
               "pacer_rpc_fuzz: FAILED: %s\n--- the input ---\n%s--- end ---\nthe %zu inputs this pacerd "
               "(policy '%s') ran are in %s/: replay them with PACER_FUZZ_POLICY='%s' pacer_rpc_fuzz "
               "--restart-every=100000 %s\n",
               what.c_str(), text.c_str(), since_start_.size(), policy_.c_str(), dir.c_str(), policy_.c_str(),
               dir.c_str());
  std::fflush(stderr);
  std::abort();
}

grpc::Status Target::Send(const Method& m, const std::string& body, const std::string& token,
                          std::string* reply) {
  grpc::ClientContext ctx;
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  // A waiting Get returns at its deadline; any other call taking 60 s is a hang.
  ctx.set_deadline(std::chrono::system_clock::now() +
                   (m.waits ? std::chrono::milliseconds(30) : std::chrono::milliseconds(60'000)));
  grpc::Slice slice(body);
  grpc::ByteBuffer request(&slice, 1), response;
  const grpc::internal::RpcMethod rpc(m.path.c_str(), grpc::internal::RpcMethod::NORMAL_RPC);
  grpc::Status s = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel_.get(), rpc, &ctx, request, &response);
  if (s.ok()) *reply = Flatten(response);
  return s;
}

void Target::CheckStatus(const Method& m, const grpc::Status& s, const std::string& reply) {
  ++codes_[s.error_code()];
  const std::string where = absl::StrCat(m.path, " -> ", s.error_code(), " '", s.error_message(), "'");
  for (const std::string& secret : secrets_) {
    if (!secret.empty() && s.error_message().find(secret) != std::string::npos)
      Fail("an error message holds a secret: " + where);
  }
  switch (s.error_code()) {
    case grpc::StatusCode::OK:
      if (m.response != nullptr) {
        std::unique_ptr<Message> parsed(
            google::protobuf::MessageFactory::generated_factory()->GetPrototype(m.response)->New());
        if (!parsed->ParseFromString(reply)) Fail("an OK reply does not parse: " + where);
        replies_.Record(*parsed);
      }
      return;
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::DATA_LOSS:
    case grpc::StatusCode::CANCELLED:
      Fail("a status no client can act on: " + where);
    case grpc::StatusCode::UNIMPLEMENTED:
      if (m.known) Fail("UNIMPLEMENTED from a method pacerd serves: " + where);
      return;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      if (!m.waits) Fail("a call that does not wait hung: " + where);
      return;
    default:  // INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED, RESOURCE_EXHAUSTED,
              // FAILED_PRECONDITION, ABORTED, OUT_OF_RANGE, UNAVAILABLE, UNAUTHENTICATED
      return;
  }
}

std::string Target::SendChecked(const std::string& path, const Message& request, const std::string& token) {
  for (const Method& m : methods_) {
    if (m.path != path) continue;
    std::string reply;
    const grpc::Status s = Send(m, request.SerializeAsString(), token, &reply);
    ++calls_;
    CheckStatus(m, s, reply);
    return s.ok() ? reply : std::string();
  }
  Fail("no method " + path);
}

void Target::RunJob(const Job& job) {
  const int workers = 2 + static_cast<int>(job.workers() % 7);
  const int ticks = 10 * (1 + static_cast<int>(job.windows() % 6));
  const int slow = static_cast<int>(job.slow() % workers);
  const double factor = 1.0 + (job.slowdown_pct() % 400) / 100.0;
  const std::string& token = tokens_[JOB_TOKEN];
  std::vector<uint64_t> incarnation(workers);
  auto id = [](int w) { return "w" + std::to_string(w); };
  for (int w = 0; w < workers; ++w) {
    RegisterWorkerRequest reg;
    reg.set_worker_id(id(w));
    reg.set_node("n0");
    RegisterWorkerResponse resp;
    resp.ParseFromString(SendChecked("/pacer.ShardingService/RegisterWorker", reg, token));
    incarnation[w] = resp.incarnation();
    MonitorRegisterRequest mreg;
    mreg.set_worker_id(id(w));
    mreg.set_node("n0");
    SendChecked("/pacer.Monitor/RegisterWorker", mreg, token);
  }
  AgentHeartbeat agent;
  agent.set_job("job");
  agent.set_node("n0");
  agent.set_agent_id("n0");
  agent.set_incarnation(1);
  for (int w = 0; w < workers; ++w) {
    WorkerProcess* p = agent.add_workers();
    p->set_worker_id(id(w));
    p->set_pid(1000 + w);
    p->set_state(WORKER_STATE_RUNNING);
    p->set_rank(w);
  }
  for (int t = 0; t < ticks; ++t) {
    ReportStepsRequest steps;
    for (int w = 0; w < workers; ++w) {
      const double compute = 0.2 * (w == slow ? factor : 1.0);
      for (int k = 0; k < 2; ++k) {
        StepReport* r = steps.add_steps();
        r->set_worker_id(id(w));
        r->set_step(++job_steps_[id(w)]);
        r->set_local_batch(32);
        r->set_samples(32);
        r->set_compute_s(compute);
        r->set_comm_s(0.02);
        r->set_wall_s(0.2 * factor + 0.02);
        r->set_time_ms(clock_->NowMs() - 500 + 250 * k);
      }
    }
    SendChecked("/pacer.Monitor/ReportSteps", steps, token);
    for (int w = 0; w < workers; ++w) {
      HeartbeatRequest hb;
      hb.set_worker_id(id(w));
      hb.set_incarnation(incarnation[w]);
      hb.set_step(job_steps_[id(w)]);
      hb.set_honors_exclusion(w % 2 == 0);
      SendChecked("/pacer.ShardingService/Heartbeat", hb, token);
    }
    SendChecked("/pacer.AgentService/Heartbeat", agent, token);
    clock_->AdvanceMs(1000);
    pacerd_->HousekeepingStep();
  }
}

void Target::RunCall(const Call& call, size_t* sent) {
  if (call.request_case() == Call::kAdvanceMs) {
    clock_->AdvanceMs(std::min(call.advance_ms(), kMaxAdvanceMs));
    pacerd_->HousekeepingStep();
    return;
  }
  if (call.request_case() == Call::kJob) {
    RunJob(call.job());
    return;
  }
  const std::string token = TokenFor(call);
  const Method* m = nullptr;
  std::string body;
  if (call.request_case() == Call::kRaw) {
    m = &methods_[call.raw().method() % methods_.size()];
    body = call.raw().body();
  } else if (call.request_case() != Call::REQUEST_NOT_SET) {
    for (const Method& candidate : methods_) {
      if (candidate.field != nullptr && candidate.field->number() == static_cast<int>(call.request_case())) {
        m = &candidate;
        break;
      }
    }
    if (m == nullptr) return;
    const Message& req = call.GetReflection()->GetMessage(call, m->field);
    std::unique_ptr<Message> request(req.New());
    request->CopyFrom(req);
    if (call.from_replies()) replies_.Fill(request.get());
    for (const Amplify& a : call.amplify()) ApplyAmplify(a, request.get());
    if (!request->SerializeToString(&body)) return;  // e.g. over 2 GB: nothing to send
  } else {
    return;
  }
  const uint32_t times = 1 + std::min(call.repeat(), kMaxRepeat);
  for (uint32_t i = 0; i < times; ++i) {
    if (*sent + body.size() > kMaxInputSentBytes) return;
    *sent += body.size();
    std::string reply;
    const grpc::Status s = Send(*m, body, token, &reply);
    ++calls_;
    if (options_.verbose) {
      std::fprintf(stderr, "  %s [%s] %zu bytes -> %d %s (%zu bytes)\n", m->path.c_str(),
                   Credential_Name(call.credential()).c_str(), body.size(), s.error_code(),
                   s.error_message().substr(0, 200).c_str(), reply.size());
    }
    CheckStatus(*m, s, reply);
  }
}

void Target::CheckHonestCall() {
  const Method* list = nullptr;
  const Method* health = nullptr;
  for (const Method& m : methods_) {
    if (m.path == "/pacer.ShardingService/ListDatasets") list = &m;
    if (m.path == kExtraMethods[0]) health = &m;
  }
  std::string reply;
  grpc::Status s = Send(*list, "", pacerd_->admin_token(), &reply);
  if (!s.ok()) Fail("pacerd no longer serves the admin's ListDatasets: " + s.error_message());
  s = Send(*health, "", "", &reply);
  if (!s.ok()) Fail("pacerd no longer answers the health check: " + s.error_message());
}

void Target::RunInput(const FuzzInput& input) {
  if (!pacerd_ || inputs_since_start_ >= options_.restart_every) {
    Stop();
    Start();
  }
  ++inputs_since_start_;
  ++inputs_;
  since_start_.push_back(input);
  current_ = &input;
  size_t sent = 0;
  const int n = std::min(input.calls_size(), kMaxCalls);
  for (int i = 0; i < n; ++i) RunCall(input.calls(i), &sent);
  CheckHonestCall();
  const int64_t rss = RssMb();
  max_rss_mb_ = std::max(max_rss_mb_, rss);
  if (rss > options_.rss_mb) Fail(absl::StrCat("RSS ", rss, " MB is over the limit of ", options_.rss_mb, " MB"));
  current_ = nullptr;
}

void Target::PrintStats() const {
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - began_).count();
  std::string codes;
  for (const auto& [code, n] : codes_) absl::StrAppend(&codes, codes.empty() ? "" : ", ", code, ":", n);
  std::fprintf(stderr,
               "pacer_rpc_fuzz: %llu inputs, %llu calls in %.1f s (%.0f calls/s), %d pacerd starts, "
               "max RSS %lld MB; status codes {%s}\n",
               static_cast<unsigned long long>(inputs_), static_cast<unsigned long long>(calls_), s,
               s > 0 ? calls_ / s : 0.0, starts_, static_cast<long long>(max_rss_mb_), codes.c_str());
}

Target* g_target = nullptr;

// Prints the run's figures and stops pacerd (main() calls it). libFuzzer ends the run with
// exit(), after RocksDB's statics (created by the first pacerd start, after this handler was
// registered) are destroyed: closing pacerd then would abort in RocksDB, so it only prints.
void EndRun() {
  if (g_target == nullptr) return;
  g_target->PrintStats();
#ifdef PACER_LIBFUZZER
  std::fflush(stderr);
  std::_Exit(0);
#endif
  delete g_target;
  g_target = nullptr;
}

Target& TheTarget() {
  if (g_target == nullptr) {
    g_target = new Target(OptionsFromEnv());
    std::atexit(EndRun);
  }
  return *g_target;
}

bool ParseInput(const uint8_t* data, size_t size, FuzzInput* input) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  // A text FuzzInput (the checked-in corpus) starts with a comment or "calls".
  if (text.substr(0, 1) == "#" || text.substr(0, 5) == "calls") {
    return google::protobuf::TextFormat::ParseFromString(std::string(text), input);
  }
  return input->ParseFromArray(data, static_cast<int>(size));
}

std::vector<std::string> Dictionary() {
  return {"w0", "w1", "w2", "w9", "n0", "n1", "n2", "ps0", "ps1", "ds0", "ds1", "d0", "job", "k",
          "gen-1/k", "rank0", "a0", "n0-agent", "cmd-1", "none", "non-dedicated", "dedicated",
          "lb-bsp", "backup-workers", "timeout-relaunch",
          "version: 1\nname: p\npolicy: non-dedicated\n", "version: 1\nname: q\npolicy: dedicated\ndry_run: true\n"};
}

}  // namespace
}  // namespace pacer::fuzz

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  setenv("PACER_LOG_LEVEL", "ERROR", 0);  // pacerd's INFO lines would drown the fuzzer's
  setenv("GRPC_VERBOSITY", "ERROR", 0);
  // pacerd's protobuf logs a line for every string field of invalid UTF-8 it parses.
  google::protobuf::SetLogHandler([](google::protobuf::LogLevel level, const char* file, int line,
                                     const std::string& message) {
    if (level >= google::protobuf::LOGLEVEL_FATAL) std::fprintf(stderr, "%s:%d %s\n", file, line, message.c_str());
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pacer::fuzz::FuzzInput input;
  if (!pacer::fuzz::ParseInput(data, size, &input)) return -1;  // not kept in the corpus
  pacer::fuzz::TheTarget().RunInput(input);
  return 0;
}

// Every mutant is a valid FuzzInput: parsed (or empty), edited by ProtoMutator, serialized.
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  pacer::fuzz::FuzzInput input;
  if (!pacer::fuzz::ParseInput(data, size, &input)) input.Clear();
  pacer::fuzz::ProtoMutator mutator(seed);
  mutator.set_dictionary(pacer::fuzz::Dictionary());
  const size_t limit = std::min(max_size, pacer::fuzz::kMaxInputBytes);
  const int edits = 1 + static_cast<int>(mutator.rng()() % 3);
  for (int i = 0; i < edits; ++i) mutator.Mutate(&input, limit);
  std::string out;
  if (!input.SerializeToString(&out) || out.size() > max_size) return size;
  std::memcpy(data, out.data(), out.size());
  return out.size();
}

extern "C" size_t LLVMFuzzerCustomCrossOver(const uint8_t* data1, size_t size1, const uint8_t* data2,
                                            size_t size2, uint8_t* out, size_t max_out_size,
                                            unsigned int seed) {
  pacer::fuzz::FuzzInput a, b;
  if (!pacer::fuzz::ParseInput(data1, size1, &a) || !pacer::fuzz::ParseInput(data2, size2, &b)) return 0;
  pacer::fuzz::ProtoMutator mutator(seed);
  mutator.CrossOver(b, &a, std::min(max_out_size, pacer::fuzz::kMaxInputBytes));
  std::string s;
  if (!a.SerializeToString(&s) || s.size() > max_out_size) return 0;
  std::memcpy(out, s.data(), s.size());
  return s.size();
}

#ifndef PACER_LIBFUZZER
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

// The smoke run (ctest) and the replay of one input (a crash file of the libFuzzer build, or a
// corpus file): pacer_rpc_fuzz [--mutations=N] [--seed=S] [--rss-mb=M] [--restart-every=K]
// [--max-seconds=T] CORPUS_DIR_OR_FILE...
int main(int argc, char** argv) {
  LLVMFuzzerInitialize(&argc, &argv);
  long mutations = 0;
  uint64_t seed = 1;
  double max_seconds = 0;
  std::vector<std::string> inputs;
  pacer::fuzz::Target& target = pacer::fuzz::TheTarget();
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* flag) -> const char* {
      const size_t n = std::strlen(flag);
      return arg.compare(0, n, flag) == 0 ? arg.c_str() + n : nullptr;
    };
    if (const char* v = value("--mutations=")) { mutations = std::atol(v); continue; }
    if (const char* v = value("--seed=")) { seed = std::strtoull(v, nullptr, 10); continue; }
    if (const char* v = value("--rss-mb=")) { target.mutable_options().rss_mb = std::atoll(v); continue; }
    if (const char* v = value("--restart-every=")) { target.mutable_options().restart_every = std::max(1, std::atoi(v)); continue; }
    if (const char* v = value("--max-seconds=")) { max_seconds = std::atof(v); continue; }
    std::error_code ec;
    if (std::filesystem::is_directory(arg, ec)) {
      std::vector<std::string> files;
      for (const auto& entry : std::filesystem::directory_iterator(arg, ec))
        if (entry.is_regular_file()) files.push_back(entry.path().string());
      std::sort(files.begin(), files.end());  // deterministic order
      for (const auto& f : files) inputs.push_back(ReadAll(f));
    } else if (std::filesystem::is_regular_file(arg, ec)) {
      inputs.push_back(ReadAll(arg));
    } else {
      std::fprintf(stderr, "pacer_rpc_fuzz: no such file or folder: %s\n", arg.c_str());
      return 2;
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "usage: pacer_rpc_fuzz [--mutations=N] [--seed=S] [--rss-mb=M] "
                         "[--restart-every=K] [--max-seconds=T] CORPUS_DIR_OR_FILE...\n");
    return 2;
  }
  std::vector<pacer::fuzz::FuzzInput> pool;
  for (const auto& in : inputs) {
    pacer::fuzz::FuzzInput parsed;
    if (!pacer::fuzz::ParseInput(reinterpret_cast<const uint8_t*>(in.data()), in.size(), &parsed)) {
      std::fprintf(stderr, "pacer_rpc_fuzz: a corpus input does not parse as a FuzzInput\n");
      return 2;
    }
    target.RunInput(parsed);
    pool.push_back(std::move(parsed));
  }
  // Mutants of the corpus, each from a pool that grows with them (a mutant of a mutant reaches
  // further than one edit from a seed), as libFuzzer's would without its coverage feedback.
  pacer::fuzz::ProtoMutator mutator(seed);
  mutator.set_dictionary(pacer::fuzz::Dictionary());
  const auto began = std::chrono::steady_clock::now();
  long ran = 0;
  for (; ran < mutations; ++ran) {
    if (max_seconds > 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count() > max_seconds) {
      std::fprintf(stderr, "pacer_rpc_fuzz: stopped after %ld of %ld mutants (--max-seconds=%g)\n", ran,
                   mutations, max_seconds);
      break;
    }
    pacer::fuzz::FuzzInput m = pool[mutator.rng()() % pool.size()];
    if (mutator.rng()() % 8 == 0) mutator.CrossOver(pool[mutator.rng()() % pool.size()], &m, pacer::fuzz::kMaxInputBytes);
    const int edits = 1 + static_cast<int>(mutator.rng()() % 4);
    for (int e = 0; e < edits; ++e) mutator.Mutate(&m, pacer::fuzz::kMaxInputBytes);
    target.RunInput(m);
    if (pool.size() < 4096 && mutator.rng()() % 4 == 0) pool.push_back(std::move(m));
  }
  std::fprintf(stderr, "pacer_rpc_fuzz: %zu corpus inputs and %ld mutants, no failure\n", inputs.size(), ran);
  pacer::fuzz::EndRun();
  return 0;
}
#endif  // PACER_LIBFUZZER
