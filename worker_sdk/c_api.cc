// The C API (c_api.h) over the C++ worker SDK: handles own the C++ objects; every Status becomes
// a pacer_code plus message. No C++ exception crosses the boundary (the core throws none; the
// allocations here are the only source, and are caught).
#include "worker_sdk/c_api.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "absl/status/status.h"
#include "worker_sdk/client.h"
#include "worker_sdk/shard_reader.h"
#include "worker_sdk/step_timer.h"

struct pacer_client {
  std::unique_ptr<pacer::Client> client;
};
struct pacer_reader {
  std::unique_ptr<pacer::ShardReader> reader;
  std::vector<uint64_t> scratch;
};
struct pacer_step_timer {
  pacer::StepTimer timer;
};

namespace {

pacer_code Report(const absl::Status& s, pacer_error* err) {
  const auto code = static_cast<pacer_code>(static_cast<int>(s.code()));
  if (err != nullptr) {
    err->code = code;
    const size_t n = std::min(s.message().size(), sizeof(err->message) - 1);
    std::memcpy(err->message, s.message().data(), n);
    err->message[n] = '\0';
  }
  return code;
}

pacer_code Null(const char* what, pacer_error* err) {
  return Report(absl::InvalidArgumentError(std::string(what) + " is NULL"), err);
}

}  // namespace

extern "C" {

pacer_code pacer_client_connect(const pacer_client_options* options, pacer_client** out, pacer_error* err) {
  if (out == nullptr) return Null("out", err);
  *out = nullptr;
  try {
    pacer::ClientOptions o;
    if (options != nullptr) {
      if (options->address) o.address = options->address;
      if (options->token) o.token = options->token;
      if (options->token_file) o.token_file = options->token_file;
      if (options->worker_id) o.worker_id = options->worker_id;
      if (options->job) o.job = options->job;
      if (options->node) o.node = options->node;
      if (options->connect_budget_ms > 0) o.connect_budget_ms = options->connect_budget_ms;
      if (options->rpc_timeout_ms > 0) o.rpc_timeout_ms = options->rpc_timeout_ms;
      if (options->initial_micro_batch > 0) o.initial_micro_batch = options->initial_micro_batch;
      o.honors_exclusion = options->honors_exclusion != 0;
      if (options->tls_ca) o.tls.ca_file = options->tls_ca;
      if (options->tls_cert) o.tls.cert_file = options->tls_cert;
      if (options->tls_key) o.tls.key_file = options->tls_key;
      if (options->tls_server_name) o.tls.server_name = options->tls_server_name;
      o.tls.allow_insecure = options->allow_insecure != 0;
    }
    auto c = pacer::Client::Connect(std::move(o));
    if (!c.ok()) return Report(c.status(), err);
    *out = new pacer_client{std::move(*c)};
    return Report(absl::OkStatus(), err);
  } catch (const std::bad_alloc&) {
    return Report(absl::ResourceExhaustedError("out of memory"), err);
  }
}

void pacer_client_destroy(pacer_client* client, int64_t flush_timeout_ms) {
  if (client == nullptr) return;
  client->client->Close(flush_timeout_ms);
  delete client;
}

pacer_code pacer_client_flush(pacer_client* client, int64_t timeout_ms, pacer_error* err) {
  if (client == nullptr) return Null("client", err);
  return Report(client->client->Flush(timeout_ms), err);
}

pacer_code pacer_client_register_dataset(pacer_client* client, const char* name, uint64_t num_records,
                                         uint64_t shard_size, uint32_t num_epochs, uint64_t seed, int* created,
                                         pacer_error* err) {
  if (client == nullptr) return Null("client", err);
  if (name == nullptr) return Null("name", err);
  pacer::DatasetSpec spec;
  spec.set_name(name);
  spec.set_num_records(num_records);
  spec.set_shard_size(shard_size);
  spec.set_num_epochs(num_epochs);
  spec.set_shuffle(pacer::SHUFFLE_SHARDS);
  spec.set_seed(seed);
  auto r = client->client->sharding().RegisterDataset(spec);
  if (!r.ok()) return Report(r.status(), err);
  if (created != nullptr) *created = *r ? 1 : 0;
  return Report(absl::OkStatus(), err);
}

pacer_code pacer_client_batch_plan(pacer_client* client, uint64_t step, uint32_t* micro_batch,
                                   uint32_t* accumulation_steps, pacer_error* err) {
  if (client == nullptr) return Null("client", err);
  const pacer::LocalBatch& b = client->client->batch_plan().ForStep(step);
  if (micro_batch) *micro_batch = b.micro_batch;
  if (accumulation_steps) *accumulation_steps = b.accumulation_steps;
  return Report(absl::OkStatus(), err);
}

int pacer_client_stop_requested(const pacer_client* client) {
  return client != nullptr && client->client->stop_requested() ? 1 : 0;
}

int pacer_client_excluded(const pacer_client* client) {
  return client != nullptr && client->client->excluded() ? 1 : 0;
}

uint64_t pacer_client_exclusion_version(const pacer_client* client) {
  return client != nullptr ? client->client->exclusion_version() : 0;
}

pacer_code pacer_reader_create(pacer_client* client, const char* dataset, pacer_reader** out, pacer_error* err) {
  if (out == nullptr) return Null("out", err);
  *out = nullptr;
  if (client == nullptr) return Null("client", err);
  if (dataset == nullptr) return Null("dataset", err);
  pacer::ShardReaderOptions o;
  o.dataset = dataset;
  auto r = pacer::ShardReader::Create(client->client.get(), std::move(o));
  if (!r.ok()) return Report(r.status(), err);
  *out = new pacer_reader{std::move(*r), {}};
  return Report(absl::OkStatus(), err);
}

void pacer_reader_destroy(pacer_reader* reader) { delete reader; }

pacer_code pacer_reader_next(pacer_reader* reader, size_t capacity, pacer_blocking blocking, uint64_t* ids,
                             size_t* count, pacer_outcome* outcome, pacer_error* err) {
  if (reader == nullptr) return Null("reader", err);
  if (ids == nullptr || count == nullptr || outcome == nullptr) return Null("ids, count or outcome", err);
  if (capacity == 0) return Report(absl::InvalidArgumentError("capacity must be > 0"), err);
  if (blocking < PACER_NEVER || blocking > PACER_UNTIL_DATA) {
    return Report(absl::InvalidArgumentError("unknown blocking mode"), err);
  }
  reader->scratch.clear();
  auto got = reader->reader->Next(capacity, &reader->scratch,
                                  static_cast<pacer::ShardReader::Blocking>(static_cast<int>(blocking)));
  if (!got.ok()) return Report(got.status(), err);
  std::copy(reader->scratch.begin(), reader->scratch.end(), ids);
  *count = reader->scratch.size();
  *outcome = static_cast<pacer_outcome>(static_cast<int>(*got));
  return Report(absl::OkStatus(), err);
}

void pacer_reader_mark_consumed(pacer_reader* reader) {
  if (reader != nullptr) reader->reader->MarkConsumed();
}

pacer_code pacer_reader_save_checkpoint(pacer_reader* reader, const char* tag, pacer_error* err) {
  if (reader == nullptr || tag == nullptr) return Null("reader or tag", err);
  return Report(reader->reader->SaveCheckpoint(tag), err);
}

pacer_code pacer_reader_restore_checkpoint(pacer_reader* reader, const char* tag, pacer_error* err) {
  if (reader == nullptr || tag == nullptr) return Null("reader or tag", err);
  return Report(reader->reader->RestoreCheckpoint(tag), err);
}

pacer_code pacer_reader_release_all(pacer_reader* reader, int64_t timeout_ms, int* released, pacer_error* err) {
  if (reader == nullptr) return Null("reader", err);
  auto r = reader->reader->ReleaseAll(timeout_ms > 0 ? timeout_ms : 10'000);
  if (!r.ok()) return Report(r.status(), err);
  if (released != nullptr) *released = *r;
  return Report(absl::OkStatus(), err);
}

void pacer_reader_resume(pacer_reader* reader) {
  if (reader != nullptr) reader->reader->Resume();
}

uint64_t pacer_reader_records_quarantined(const pacer_reader* reader) {
  return reader != nullptr ? reader->reader->records_quarantined() : 0;
}

int pacer_reader_holding_off(const pacer_reader* reader) {
  return reader != nullptr && reader->reader->holding_off() ? 1 : 0;
}

pacer_code pacer_step_timer_create(pacer_client* client, pacer_step_timer** out, pacer_error* err) {
  if (out == nullptr) return Null("out", err);
  *out = new pacer_step_timer{pacer::StepTimer(client ? client->client.get() : nullptr)};
  return Report(absl::OkStatus(), err);
}

void pacer_step_timer_destroy(pacer_step_timer* timer) { delete timer; }

void pacer_step_timer_begin(pacer_step_timer* timer, uint64_t step) {
  if (timer) timer->timer.BeginStep(step);
}

void pacer_step_timer_add(pacer_step_timer* timer, pacer_phase phase, int64_t ns) {
  if (timer && (phase == PACER_PHASE_DATA_WAIT || phase == PACER_PHASE_COMMUNICATION)) {
    timer->timer.Add(static_cast<pacer::StepTimer::Phase>(static_cast<int>(phase)), ns);
  }
}

void pacer_step_timer_end(pacer_step_timer* timer, uint32_t local_batch, uint64_t samples) {
  if (timer) timer->timer.EndStep(local_batch, samples);
}

}  // extern "C"
