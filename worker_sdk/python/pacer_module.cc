// pacer._pacer: the Python binding of the worker SDK (docs/design.md §6), imported as `pacer`.
//
// Wraps Client, ShardReader, StepTimer and the batch plan (LocalBatchPlan). The pure-Python
// package part (pacer/__init__.py, pacer/torch.py) re-exports these and adds PyTorch helpers.
//
// Boundary rules:
//   - Every absl::Status error becomes a Python exception: a subclass of pacer.Error named for
//     the code (UnavailableError, UnauthenticatedError, InvalidArgumentError, ...), whose
//     message is the Status message and whose `code` attribute is the code's name. Nothing in
//     the C++ core throws; only this file raises.
//   - The GIL is released around every call that may block (connect, fetch, flush, close,
//     checkpoints, dataset registration) so other Python threads keep running.
//   - Ownership: PyClient owns the Client; PyShardReader owns the ShardReader and keeps its
//     PyClient alive (py::keep_alive), so a reader can never outlive the client it reads
//     through. Closing the client first (client.close() or leaving its `with` block) is the
//     cheap order: the reader's destructor then does not wait on retries.
//   - Thread-safety: as the C++ classes. A ShardReader and a StepTimer belong to one training
//     thread; a Client may be shared.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/auth.h"
#include "proto/pacer/sharding.pb.h"
#include "worker_sdk/batch_plan.h"
#include "worker_sdk/client.h"
#include "worker_sdk/client_options.h"
#include "worker_sdk/shard_reader.h"
#include "worker_sdk/step_timer.h"

namespace py = pybind11;

namespace pacer {
namespace {

// Exception classes by status code, created at module init; base is kErrorBase.
std::map<absl::StatusCode, py::object>* g_errors = nullptr;
py::object* g_error_base = nullptr;

const char* ErrorClassName(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kCancelled: return "CancelledError";
    case absl::StatusCode::kInvalidArgument: return "InvalidArgumentError";
    case absl::StatusCode::kDeadlineExceeded: return "DeadlineExceededError";
    case absl::StatusCode::kNotFound: return "NotFoundError";
    case absl::StatusCode::kAlreadyExists: return "AlreadyExistsError";
    case absl::StatusCode::kPermissionDenied: return "PermissionDeniedError";
    case absl::StatusCode::kResourceExhausted: return "ResourceExhaustedError";
    case absl::StatusCode::kFailedPrecondition: return "FailedPreconditionError";
    case absl::StatusCode::kAborted: return "AbortedError";
    case absl::StatusCode::kOutOfRange: return "OutOfRangeError";
    case absl::StatusCode::kUnimplemented: return "UnimplementedError";
    case absl::StatusCode::kInternal: return "InternalError";
    case absl::StatusCode::kUnavailable: return "UnavailableError";
    case absl::StatusCode::kDataLoss: return "DataLossError";
    case absl::StatusCode::kUnauthenticated: return "UnauthenticatedError";
    default: return nullptr;  // kUnknown and anything new: the base class
  }
}

// Raises the Python exception for a non-OK `status` (GIL held).
[[noreturn]] void Raise(const absl::Status& status) {
  auto it = g_errors->find(status.code());
  py::object type = it != g_errors->end() ? it->second : *g_error_base;
  const std::string message = std::string(absl::StatusCodeToString(status.code())) + ": " +
                              std::string(status.message());
  py::object exc = type(message);
  exc.attr("code") = absl::StatusCodeToString(status.code());
  exc.attr("status_message") = std::string(status.message());
  PyErr_SetObject(type.ptr(), exc.ptr());
  throw py::error_already_set();
}

void Check(const absl::Status& status) {
  if (!status.ok()) Raise(status);
}

template <typename T>
T Value(absl::StatusOr<T> v) {
  if (!v.ok()) Raise(v.status());
  return *std::move(v);
}

// ---- Client ----

class PyClient {
 public:
  explicit PyClient(std::unique_ptr<Client> client) : client_(std::move(client)) {}
  ~PyClient() {
    // Close() flushes for a bounded time; never hold the GIL across it.
    py::gil_scoped_release release;
    client_.reset();
  }

  Client& get() {
    if (client_ == nullptr) Raise(absl::FailedPreconditionError("the client is closed"));
    return *client_;
  }
  Client* raw() { return client_.get(); }
  void Close(int64_t flush_timeout_ms) {
    if (client_ == nullptr) return;
    py::gil_scoped_release release;
    client_->Close(flush_timeout_ms);
  }

 private:
  std::unique_ptr<Client> client_;
};

std::unique_ptr<PyClient> ConnectClient(std::optional<std::string> address, std::optional<std::string> token,
                                        std::optional<std::string> token_file,
                                        std::optional<std::string> worker_id, std::optional<std::string> job,
                                        std::optional<std::string> node, int64_t connect_budget_ms,
                                        int64_t rpc_timeout_ms, int64_t call_budget_ms,
                                        int64_t heartbeat_interval_ms, bool report_steps,
                                        uint32_t initial_micro_batch, uint32_t initial_accumulation_steps,
                                        bool honors_exclusion, std::optional<std::string> tls_ca,
                                        std::optional<std::string> tls_cert, std::optional<std::string> tls_key,
                                        std::optional<std::string> tls_server_name, bool allow_insecure) {
  ClientOptions o;
  // Explicit arguments win over the environment (Resolve fills only empty fields).
  if (address) o.address = *address;
  if (token) o.token = *token;
  if (token_file) o.token_file = *token_file;
  if (worker_id) o.worker_id = *worker_id;
  if (job) o.job = *job;
  if (node) o.node = *node;
  o.connect_budget_ms = connect_budget_ms;
  o.rpc_timeout_ms = rpc_timeout_ms;
  o.call_budget_ms = call_budget_ms;
  o.heartbeat_interval_ms = heartbeat_interval_ms;
  o.report_steps = report_steps;
  o.initial_micro_batch = initial_micro_batch;
  o.initial_accumulation_steps = initial_accumulation_steps;
  o.honors_exclusion = honors_exclusion;
  // TLS (docs/tls.md); None takes PACER_TLS_CA / _CERT / _KEY / _SERVER_NAME.
  if (tls_ca) o.tls.ca_file = *tls_ca;
  if (tls_cert) o.tls.cert_file = *tls_cert;
  if (tls_key) o.tls.key_file = *tls_key;
  if (tls_server_name) o.tls.server_name = *tls_server_name;
  o.tls.allow_insecure = allow_insecure;
  if (initial_micro_batch == 0 || initial_accumulation_steps == 0) {
    Raise(absl::InvalidArgumentError("initial_micro_batch and initial_accumulation_steps must be > 0"));
  }
  absl::StatusOr<std::unique_ptr<Client>> c;
  {
    py::gil_scoped_release release;
    c = Client::Connect(std::move(o));
  }
  return std::make_unique<PyClient>(Value(std::move(c)));
}

bool RegisterDataset(PyClient& self, const std::string& name, uint64_t num_records, uint64_t shard_size,
                     uint32_t num_epochs, const std::string& shuffle, uint64_t seed, uint64_t batch_size) {
  ShuffleMode mode;
  if (shuffle == "none") {
    mode = SHUFFLE_NONE;
  } else if (shuffle == "shards") {
    mode = SHUFFLE_SHARDS;
  } else if (shuffle == "records") {
    mode = SHUFFLE_RECORDS;
  } else {
    Raise(absl::InvalidArgumentError("shuffle must be 'none', 'shards' or 'records', not '" + shuffle + "'"));
  }
  DatasetSpec spec;
  spec.set_name(name);
  spec.set_num_records(num_records);
  spec.set_shard_size(shard_size);
  spec.set_num_epochs(num_epochs);
  spec.set_shuffle(mode);
  spec.set_seed(seed);
  spec.set_batch_size(batch_size);
  Client& c = self.get();
  absl::StatusOr<bool> created;
  {
    py::gil_scoped_release release;
    created = c.sharding().RegisterDataset(spec);
  }
  return Value(std::move(created));
}

py::dict Stats(PyClient& self) {
  const ClientStats s = self.get().stats();
  py::dict d;
  d["heartbeats_ok"] = s.heartbeats_ok;
  d["heartbeat_failures"] = s.heartbeat_failures;
  d["progress_acked"] = s.progress_acked;
  d["completions_acked"] = s.completions_acked;
  d["leases_cancelled"] = s.leases_cancelled;
  d["steps_sent"] = s.steps_sent;
  d["steps_rejected"] = s.steps_rejected;
  d["steps_dropped"] = s.steps_dropped;
  d["monitor_reregistrations"] = s.monitor_reregistrations;
  d["plans_received"] = s.plans_received;
  return d;
}

// ---- ShardReader ----

class PyShardReader {
 public:
  PyShardReader(PyClient& client, std::string dataset, int prefetch_leases) {
    ShardReaderOptions o;
    o.dataset = std::move(dataset);
    o.prefetch_leases = prefetch_leases;
    Client* c = &client.get();
    absl::StatusOr<std::unique_ptr<ShardReader>> r;
    {
      py::gil_scoped_release release;
      r = ShardReader::Create(c, std::move(o));
    }
    reader_ = Value(std::move(r));
  }
  ~PyShardReader() {
    py::gil_scoped_release release;
    reader_.reset();
  }

  // (outcome, ids); outcome is ShardReader.RECORDS / WAIT / END_OF_DATA.
  //
  // UNTIL_DATA here never waits while holding records it handed out in the same call: a
  // ShardReader::Next(n, kUntilData) that takes the tail of the last lease and then waits for
  // more would wait forever, because the service announces the end of the data only once that
  // lease is complete, which needs those very records marked consumed. So: take what is ready
  // (kUntilPrefetched); when nothing is, block for a single record (kUntilData, n = 1, nothing
  // else held), then add what is ready after it. A batch is short only at a lease boundary the
  // service is not ready to cross.
  // With `epochs`, the epoch of each id is appended to it.
  std::pair<ShardReader::Outcome, std::vector<uint64_t>> Next(size_t n, ShardReader::Blocking blocking,
                                                              std::vector<uint32_t>* ep = nullptr) {
    if (n == 0) Raise(absl::InvalidArgumentError("next(n): n must be > 0"));
    std::vector<uint64_t> ids;
    absl::StatusOr<ShardReader::Outcome> got;
    {
      py::gil_scoped_release release;
      if (blocking != ShardReader::Blocking::kUntilData) {
        got = reader_->Next(n, &ids, blocking, ep);
      } else {
        got = reader_->Next(n, &ids, ShardReader::Blocking::kUntilPrefetched, ep);
        if (got.ok() && ids.empty() && *got == ShardReader::Outcome::kWait) {
          got = reader_->Next(1, &ids, ShardReader::Blocking::kUntilData, ep);
          if (got.ok() && !ids.empty() && n > 1) {
            absl::StatusOr<ShardReader::Outcome> more =
                reader_->Next(n - 1, &ids, ShardReader::Blocking::kUntilPrefetched, ep);
            if (!more.ok()) got = more.status();
          }
        }
      }
    }
    return {Value(std::move(got)), std::move(ids)};
  }
  // next() in Python: (outcome, ids), or (outcome, ids, epochs) with epochs=True.
  py::tuple NextForPython(size_t n, ShardReader::Blocking blocking, bool with_epochs) {
    if (!with_epochs) {
      auto [outcome, ids] = Next(n, blocking);
      return py::make_tuple(outcome, std::move(ids));
    }
    std::vector<uint32_t> epochs;
    auto [outcome, ids] = Next(n, blocking, &epochs);
    return py::make_tuple(outcome, std::move(ids), std::move(epochs));
  }
  void MarkConsumed() { reader_->MarkConsumed(); }  // queues only: no network, keeps the GIL
  void MarkConsumedThrough(uint64_t position) {
    if (position > reader_->records_read()) {
      Raise(absl::InvalidArgumentError("mark_consumed(through=" + std::to_string(position) +
                                       "): only " + std::to_string(reader_->records_read()) +
                                       " records were handed out"));
    }
    reader_->MarkConsumedThrough(position);
  }
  void Save(const std::string& tag, int64_t flush_timeout_ms) {
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = reader_->SaveCheckpoint(tag, flush_timeout_ms);
    }
    Check(s);
  }
  void Restore(const std::string& tag) {
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = reader_->RestoreCheckpoint(tag);
    }
    Check(s);
  }
  // EXCLUDE_WORKERS: hands every lease back (after marking what was handed out consumed and
  // waiting for pacerd's acknowledgement) and stops leasing until Resume(). Blocks: no GIL.
  int ReleaseAll(int64_t timeout_ms) {
    if (timeout_ms <= 0) Raise(absl::InvalidArgumentError("release_all(timeout_ms): timeout_ms must be > 0"));
    absl::StatusOr<int> r;
    {
      py::gil_scoped_release release;
      r = reader_->ReleaseAll(timeout_ms);
    }
    return Value(std::move(r));
  }
  ShardReader& get() { return *reader_; }

 private:
  std::unique_ptr<ShardReader> reader_;
};

// Iterates single record ids, blocking until data and ending at the end of the data. Records
// are fetched `chunk` at a time; before fetching more, every record yielded so far is marked
// consumed (when `mark_consumed`): asking for the next record declares the previous ones
// trained. Without that, the last lease could never complete while the iterator waits for the
// end of the data, which the service announces only once every lease is complete.
class RecordIterator {
 public:
  RecordIterator(PyShardReader* reader, size_t chunk, bool mark_consumed)
      : reader_(reader), chunk_(chunk), mark_consumed_(mark_consumed) {}
  uint64_t Next() {
    if (pos_ >= buf_.size()) {
      if (mark_consumed_ && !buf_.empty()) reader_->MarkConsumed();
      if (ended_) throw py::stop_iteration();
      buf_.clear();
      pos_ = 0;
      auto [outcome, ids] = reader_->Next(chunk_, ShardReader::Blocking::kUntilData);
      buf_ = std::move(ids);
      if (outcome == ShardReader::Outcome::kEndOfData) ended_ = true;
      if (buf_.empty() && outcome == ShardReader::Outcome::kWait && !mark_consumed_ &&
          reader_->get().records_read() > 0 && !reader_->get().holding_off()) {
        // Every record yielded is still unconsumed and the service has nothing else until they
        // are (the rest of the data is in those leases, or they fill the lease quota): ending
        // the iteration here would read as the end of the data.
        Raise(absl::FailedPreconditionError(
            "records(mark_consumed=False): the service has no more records until the ones "
            "yielded so far are marked consumed; call mark_consumed() and iterate again"));
      }
      if (buf_.empty()) throw py::stop_iteration();
    }
    return buf_[pos_++];
  }

 private:
  PyShardReader* reader_;
  size_t chunk_;
  bool mark_consumed_;
  std::vector<uint64_t> buf_;
  size_t pos_ = 0;
  bool ended_ = false;
};

// ---- StepTimer ----

// A with-block timing one phase of the current step.
class PhaseScope {
 public:
  PhaseScope(StepTimer* timer, StepTimer::Phase phase) : timer_(timer), phase_(phase) {}
  void Enter() { scope_.emplace(timer_, phase_); }
  void Exit() { scope_.reset(); }

 private:
  StepTimer* timer_;
  StepTimer::Phase phase_;
  std::optional<StepTimer::Scope> scope_;
};

py::dict ReportDict(const StepReport& r) {
  py::dict d;
  d["step"] = r.step();
  d["local_batch"] = r.local_batch();
  d["samples"] = r.samples();
  d["compute_s"] = r.compute_s();
  d["comm_s"] = r.comm_s();
  d["data_wait_s"] = r.data_wait_s();
  d["wall_s"] = r.wall_s();
  return d;
}

py::dict LocalBatchDict(const LocalBatch& b) {
  py::dict d;
  d["version"] = b.version;
  d["effective_step"] = b.effective_step;
  d["micro_batch"] = b.micro_batch;
  d["accumulation_steps"] = b.accumulation_steps;
  d["global_batch"] = b.global_batch;
  d["samples"] = b.samples();
  return d;
}

}  // namespace
}  // namespace pacer

PYBIND11_MODULE(_pacer, m) {
  using namespace pacer;
  m.doc() = "Pacer worker SDK (C++ core); import it as `pacer`.";

  // Exceptions: pacer.Error(RuntimeError) and one subclass per absl status code.
  g_error_base = new py::object(py::reinterpret_steal<py::object>(
      PyErr_NewExceptionWithDoc("pacer.Error", "A Pacer call failed; `code` names the status code.",
                                PyExc_RuntimeError, nullptr)));
  m.attr("Error") = *g_error_base;
  g_errors = new std::map<absl::StatusCode, py::object>();
  for (int c = 1; c <= 16; ++c) {
    const auto code = static_cast<absl::StatusCode>(c);
    const char* name = ErrorClassName(code);
    if (name == nullptr) continue;
    const std::string qualified = std::string("pacer.") + name;
    py::object type = py::reinterpret_steal<py::object>(
        PyErr_NewException(qualified.c_str(), g_error_base->ptr(), nullptr));
    m.attr(name) = type;
    (*g_errors)[code] = type;
  }

  m.def(
      "mint_credential",
      [](const std::string& job_token, const std::string& kind, const std::string& id) {
        auto k = ParseCredentialKind(kind);
        Check(k.status());
        auto c = MintCredential(job_token, *k, id);
        Check(c.status());
        return *c;
      },
      py::arg("job_token"), py::arg("kind"), py::arg("id"),
      "A credential bound to one id, minted from the job token (docs/security.md): kind is "
      "'worker', 'chief' (global rank 0), 'agent' (id = node) or 'server'. Give each worker its "
      "own in PACER_TOKEN instead of the job token; pacer-agent does this by itself.");

  py::class_<LocalBatch>(m, "LocalBatch", "This worker's batch for a step (micro batch x accumulation).")
      .def_readonly("version", &LocalBatch::version)
      .def_readonly("effective_step", &LocalBatch::effective_step)
      .def_readonly("micro_batch", &LocalBatch::micro_batch)
      .def_readonly("accumulation_steps", &LocalBatch::accumulation_steps)
      .def_readonly("global_batch", &LocalBatch::global_batch)
      .def_property_readonly("samples", &LocalBatch::samples)
      .def("as_dict", &LocalBatchDict)
      .def("__repr__", [](const LocalBatch& b) {
        return "LocalBatch(version=" + std::to_string(b.version) + ", micro_batch=" +
               std::to_string(b.micro_batch) + ", accumulation_steps=" + std::to_string(b.accumulation_steps) +
               ", effective_step=" + std::to_string(b.effective_step) + ")";
      });

  py::class_<PyClient>(m, "Client",
                       "A worker's connection to its job's pacerd. Arguments left as None come from the "
                       "environment the node agent sets (PACER_ADDR, PACER_JOB, PACER_WORKER_ID, PACER_TOKEN, "
                       "PACER_NODE; TLS: PACER_TLS_CA, PACER_TLS_CERT, PACER_TLS_KEY). Raises UnauthenticatedError (wrong token), UnavailableError (pacerd "
                       "unreachable for connect_budget_ms) or InvalidArgumentError (missing id/token).")
      .def(py::init(&ConnectClient), py::kw_only(), py::arg("address") = py::none(), py::arg("token") = py::none(),
           py::arg("token_file") = py::none(), py::arg("worker_id") = py::none(), py::arg("job") = py::none(),
           py::arg("node") = py::none(), py::arg("connect_budget_ms") = 60'000, py::arg("rpc_timeout_ms") = 10'000,
           py::arg("call_budget_ms") = 120'000, py::arg("heartbeat_interval_ms") = 0,
           py::arg("report_steps") = true, py::arg("initial_micro_batch") = 32,
           py::arg("initial_accumulation_steps") = 1, py::arg("honors_exclusion") = false,
           py::arg("tls_ca") = py::none(), py::arg("tls_cert") = py::none(), py::arg("tls_key") = py::none(),
           py::arg("tls_server_name") = py::none(), py::arg("allow_insecure") = false)
      .def_property_readonly("worker_id", [](PyClient& c) { return c.get().worker_id(); })
      .def_property_readonly("address", [](PyClient& c) { return c.get().options().address; })
      .def_property_readonly("heartbeat_interval_ms", [](PyClient& c) { return c.get().heartbeat_interval_ms(); })
      .def_property_readonly("incarnation", [](PyClient& c) { return c.get().sharding().incarnation(); })
      .def_property_readonly("stop_requested", [](PyClient& c) { return c.get().stop_requested(); })
      .def_property_readonly("stop_reason", [](PyClient& c) { return c.get().stop_reason(); })
      .def_property_readonly("honors_exclusion", [](PyClient& c) { return c.get().options().honors_exclusion; })
      .def_property_readonly(
          "excluded", [](PyClient& c) { return c.get().excluded(); },
          "EXCLUDE_WORKERS (honors_exclusion=True): True while the job's steps do not wait for this "
          "worker. Flips at heartbeat replies; read it once per step. While True the trainer calls "
          "reader.release_all() once (after the records handed out are trained), joins every "
          "all-reduce with weight 0, and still times a probe of about half its batch every couple of "
          "seconds (StepTimer) so pacerd sees it recover; when False again, reader.resume().")
      .def_property_readonly("exclusion_version", [](PyClient& c) { return c.get().exclusion_version(); },
                             "The version of the newest exclusion command held (0: none).")
      .def_property_readonly("closed", [](PyClient& c) { return c.raw() == nullptr; })
      .def("register_dataset", &RegisterDataset, py::arg("name"), py::kw_only(), py::arg("num_records"),
           py::arg("shard_size") = 0, py::arg("num_epochs") = 1, py::arg("shuffle") = "shards", py::arg("seed") = 0,
           py::arg("batch_size") = 0,
           "Registers an indexable dataset of records 0..num_records-1 (shuffle: 'none', 'shards' or "
           "'records', seeded per epoch); True when created, False when an identical one exists.")
      .def("set_step", [](PyClient& c, uint64_t step) { c.get().SetStep(step); }, py::arg("step"))
      .def("batch_plan", [](PyClient& c, uint64_t step) { return c.get().batch_plan().ForStep(step); },
           py::arg("step"), "The local batch in force at `step` (training thread; a pending plan switches here).")
      .def_property_readonly("current_plan", [](PyClient& c) { return c.get().batch_plan().current(); })
      .def("flush",
           [](PyClient& c, int64_t timeout_ms) {
             Client& client = c.get();
             absl::Status s;
             {
               py::gil_scoped_release release;
               s = client.Flush(timeout_ms);
             }
             Check(s);
           },
           py::arg("timeout_ms") = 30'000, "Waits until everything queued is acknowledged by pacerd.")
      .def("save_checkpoint",
           [](PyClient& c, const std::string& tag, int64_t flush_timeout_ms) {
             Client& client = c.get();
             absl::Status s;
             {
               py::gil_scoped_release release;
               s = client.Flush(flush_timeout_ms);
               if (s.ok()) s = client.sharding().SaveCheckpoint(tag);
             }
             Check(s);
           },
           py::arg("tag"), py::arg("flush_timeout_ms") = 30'000,
           "Waits until this worker's queued progress is acknowledged, then pins the job's data "
           "position (every dataset) as checkpoint `tag` on pacerd. Call it on one worker after "
           "every worker flushed (a barrier); pacer.torch.DataLoader.state_dict() does all that.")
      .def("restore_checkpoint",
           [](PyClient& c, const std::string& tag) {
             Client& client = c.get();
             absl::Status s;
             {
               py::gil_scoped_release release;
               s = client.sharding().RestoreCheckpoint(tag);
             }
             Check(s);
           },
           py::arg("tag"),
           "Moves the job's data position back to checkpoint `tag` (every lease is fenced; what was "
           "consumed after it is delivered again). Call it on one worker while no worker reads.")
      .def("check_health", [](PyClient& c) { Check(c.get().health()); },
           "Raises the reporter's latched permanent failure, if any.")
      .def("stats", &Stats)
      .def("close", &PyClient::Close, py::arg("flush_timeout_ms") = 5'000)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyClient& c, py::args) { c.Close(5'000); });

  py::class_<PyShardReader> reader(m, "ShardReader",
                                   "Record ids of leased shards with prefetch. next(n) hands out up to n ids; "
                                   "mark_consumed() declares every id handed out so far trained. Iterating "
                                   "yields ids one by one and marks the earlier ones consumed as it goes.");
  py::enum_<ShardReader::Outcome>(reader, "Outcome")
      .value("RECORDS", ShardReader::Outcome::kRecords)
      .value("WAIT", ShardReader::Outcome::kWait)
      .value("END_OF_DATA", ShardReader::Outcome::kEndOfData);
  py::enum_<ShardReader::Blocking>(reader, "Blocking")
      .value("NEVER", ShardReader::Blocking::kNever)
      .value("UNTIL_PREFETCHED", ShardReader::Blocking::kUntilPrefetched)
      .value("UNTIL_DATA", ShardReader::Blocking::kUntilData);
  reader
      .def(py::init<PyClient&, std::string, int>(), py::arg("client"), py::kw_only(), py::arg("dataset") = "train",
           py::arg("prefetch_leases") = 1, py::keep_alive<1, 2>())
      .def("next", &PyShardReader::NextForPython, py::arg("n"), py::arg("blocking") = ShardReader::Blocking::kUntilData,
           py::kw_only(), py::arg("epochs") = false,
           "Up to n record ids: returns (Outcome, [ids]); with epochs=True (Outcome, [ids], "
           "[epochs]), the epoch of each id (one call may cross into the next epoch).")
      .def("mark_consumed",
           [](PyShardReader& r, std::optional<uint64_t> through) {
             if (through) {
               r.MarkConsumedThrough(*through);
             } else {
               r.MarkConsumed();
             }
           },
           py::arg("through") = py::none(),
           "Every record handed out so far is trained: queue its progress (never blocks). With "
           "through=P only the records handed out before position P (records_read after the "
           "batch's next()) count, for trainers that read ahead.")
      .def("save_checkpoint", &PyShardReader::Save, py::arg("tag"), py::arg("flush_timeout_ms") = 30'000)
      .def("restore_checkpoint", &PyShardReader::Restore, py::arg("tag"))
      .def("release_all", &PyShardReader::ReleaseAll, py::arg("timeout_ms") = 10'000,
           "What an excluded worker does: marks every record handed out consumed, waits until pacerd "
           "acknowledged it, hands every lease back at its done prefix and leases nothing until "
           "resume() (next() then returns WAIT at once). Returns how many leases went back; "
           "idempotent. On an error the leases not yet released stay held: call it again.")
      .def("resume", [](PyShardReader& r) { r.get().Resume(); }, "Leasing goes on (after release_all).")
      .def("retry_now", [](PyShardReader& r) { r.get().RetryNow(); },
           "After a WAIT: the next next() asks pacerd again at once, not after the WAIT's retry "
           "delay (e.g. once this rank's completions are sent). No-op otherwise.")
      .def_property_readonly("holding_off", [](PyShardReader& r) { return r.get().holding_off(); },
                             "True between release_all() and resume().")
      .def_property_readonly("records_read", [](PyShardReader& r) { return r.get().records_read(); })
      .def_property_readonly(
          "records_held", [](PyShardReader& r) { return r.get().records_held(); },
          "Records leased but not handed out yet (what release_all() would give back).")
      .def_property_readonly(
          "records_quarantined", [](PyShardReader& r) { return r.get().records_quarantined(); },
          "After END_OF_DATA: records quarantined as poison (on_poison: continue) and never "
          "trained on; 0 when the data ended without a hole.")
      .def_property_readonly("leases_read", [](PyShardReader& r) { return r.get().leases_read(); })
      .def("records",
           [](PyShardReader& r, size_t chunk, bool mark_consumed) {
             if (chunk == 0) Raise(absl::InvalidArgumentError("records(chunk): chunk must be > 0"));
             return RecordIterator(&r, chunk, mark_consumed);
           },
           py::arg("chunk") = 1, py::arg("mark_consumed") = true, py::keep_alive<0, 1>(),
           "Iterates record ids; asking for more marks the ones yielded so far consumed.")
      .def("__iter__", [](PyShardReader& r) { return RecordIterator(&r, 1, true); }, py::keep_alive<0, 1>());

  py::class_<RecordIterator>(m, "_RecordIterator")
      .def("__iter__", [](RecordIterator& it) -> RecordIterator& { return it; })
      .def("__next__", &RecordIterator::Next);

  py::class_<PhaseScope>(m, "_PhaseScope")
      .def("__enter__", [](py::object self) {
        self.cast<PhaseScope&>().Enter();
        return self;
      })
      .def("__exit__", [](PhaseScope& s, py::args) { s.Exit(); });

  py::class_<StepTimer> timer(m, "StepTimer",
                              "Per-step data wait / communication / compute; reports go to the client's "
                              "reporter (batched). One timer per training thread.");
  py::enum_<StepTimer::Phase>(timer, "Phase")
      .value("DATA_WAIT", StepTimer::Phase::kDataWait)
      .value("COMMUNICATION", StepTimer::Phase::kCommunication);
  timer
      .def(py::init([](py::object client) {
             Client* c = client.is_none() ? nullptr : &client.cast<PyClient&>().get();
             return std::make_unique<StepTimer>(c);
           }),
           py::arg("client") = py::none(), py::keep_alive<1, 2>())
      .def("begin_step", &StepTimer::BeginStep, py::arg("step"), py::arg("samples") = 0,
           "Begins a step. samples > 0 (what the step computes): heartbeats sent while it runs say "
           "how long it has computed so far; pass it only when input waits and collective calls "
           "are timed with data_wait() / communication() blocks as they happen.")
      .def("data_wait", [](StepTimer& t) { return std::make_unique<PhaseScope>(&t, StepTimer::Phase::kDataWait); },
           py::keep_alive<0, 1>(), "A with-block counted as data wait.")
      .def("communication", [](StepTimer& t) { return std::make_unique<PhaseScope>(&t, StepTimer::Phase::kCommunication); },
           py::keep_alive<0, 1>(), "A with-block counted as communication.")
      .def("add", &StepTimer::Add, py::arg("phase"), py::arg("ns"))
      .def("note_progress", &StepTimer::NoteProgress, py::arg("samples_done"),
           "The running step (begun with samples > 0) has computed samples_done of them so far: "
           "the heartbeats carry it, so that pacerd measures a slowed worker's speed within its "
           "slow step. Call it between micro-batches, outside data_wait() / communication().")
      .def("end_step", [](StepTimer& t, uint32_t local_batch, uint64_t samples) {
             return ReportDict(t.EndStep(local_batch, samples));
           },
           py::arg("local_batch"), py::arg("samples"), "Ends the step; queues its report; returns it as a dict.");
}
