/* Pacer worker SDK, C API (docs/design.md §6): for trainers in languages other than C++/Python.
 *
 * Opaque handles wrap the C++ Client, ShardReader and StepTimer (worker_sdk/client.h,
 * shard_reader.h, step_timer.h; their semantics and thread-safety apply unchanged). Every call
 * that can fail returns a pacer_code (0 = PACER_OK; the other values are absl's status codes)
 * and, when `err` is not NULL, fills it with the code and the message (truncated to fit).
 * Nothing here throws or aborts on bad input: a NULL handle or argument is PACER_INVALID_ARGUMENT.
 *
 * Ownership: *_create/_connect hand the caller a handle that it must release with the matching
 * *_destroy. A reader and a timer must be destroyed before their client. Strings passed in are
 * copied; the library keeps no pointer to caller memory.
 */
#ifndef PACER_WORKER_SDK_C_API_H_
#define PACER_WORKER_SDK_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pacer_code {
  PACER_OK = 0,
  PACER_CANCELLED = 1,
  PACER_UNKNOWN = 2,
  PACER_INVALID_ARGUMENT = 3,
  PACER_DEADLINE_EXCEEDED = 4,
  PACER_NOT_FOUND = 5,
  PACER_ALREADY_EXISTS = 6,
  PACER_PERMISSION_DENIED = 7,
  PACER_RESOURCE_EXHAUSTED = 8,
  PACER_FAILED_PRECONDITION = 9,
  PACER_ABORTED = 10,
  PACER_OUT_OF_RANGE = 11,
  PACER_UNIMPLEMENTED = 12,
  PACER_INTERNAL = 13,
  PACER_UNAVAILABLE = 14,
  PACER_DATA_LOSS = 15,
  PACER_UNAUTHENTICATED = 16
} pacer_code;

typedef struct pacer_error {
  pacer_code code;
  char message[1024]; /* NUL-terminated */
} pacer_error;

typedef struct pacer_client pacer_client;
typedef struct pacer_reader pacer_reader;
typedef struct pacer_step_timer pacer_step_timer;

/* NULL or 0 fields take the environment (PACER_ADDR, PACER_TOKEN, ...) or the defaults. */
typedef struct pacer_client_options {
  const char* address;
  const char* token;
  const char* token_file;
  const char* worker_id;
  const char* job;
  const char* node;
  int64_t connect_budget_ms;    /* 0: 60 000 */
  int64_t rpc_timeout_ms;       /* 0: 10 000 */
  uint32_t initial_micro_batch; /* 0: 32 */
  /* Non-zero: the trainer carries out EXCLUDE_WORKERS (see pacer_client_excluded); pacerd
   * excludes nobody while any live worker of the job leaves this 0. */
  int honors_exclusion;
  /* TLS to pacerd (docs/tls.md); NULL takes PACER_TLS_CA / _CERT / _KEY / _SERVER_NAME. A CA
   * turns TLS on; a certificate and key (both) add mTLS. Without TLS only a loopback address is
   * dialled unless allow_insecure is non-zero (or PACER_ALLOW_INSECURE=1). */
  const char* tls_ca;
  const char* tls_cert;
  const char* tls_key;
  const char* tls_server_name;
  int allow_insecure;
} pacer_client_options;

typedef enum pacer_outcome { PACER_RECORDS = 0, PACER_WAIT = 1, PACER_END_OF_DATA = 2 } pacer_outcome;
typedef enum pacer_blocking { PACER_NEVER = 0, PACER_UNTIL_PREFETCHED = 1, PACER_UNTIL_DATA = 2 } pacer_blocking;
typedef enum pacer_phase { PACER_PHASE_DATA_WAIT = 0, PACER_PHASE_COMMUNICATION = 1 } pacer_phase;

/* ---- client ---- */
pacer_code pacer_client_connect(const pacer_client_options* options, pacer_client** out, pacer_error* err);
/* Flushes for up to flush_timeout_ms, stops the reporter, frees the handle. NULL is a no-op. */
void pacer_client_destroy(pacer_client* client, int64_t flush_timeout_ms);
pacer_code pacer_client_flush(pacer_client* client, int64_t timeout_ms, pacer_error* err);
/* Registers records 0..num_records-1 (shards shuffled with `seed`); *created (may be NULL) is
 * 1 when new, 0 when an identical dataset existed. */
pacer_code pacer_client_register_dataset(pacer_client* client, const char* name, uint64_t num_records,
                                         uint64_t shard_size, uint32_t num_epochs, uint64_t seed,
                                         int* created, pacer_error* err);
/* The batch plan in force at `step` (training thread). */
pacer_code pacer_client_batch_plan(pacer_client* client, uint64_t step, uint32_t* micro_batch,
                                   uint32_t* accumulation_steps, pacer_error* err);
/* 1 when pacerd asked this worker to stop, else 0 (also for NULL). */
int pacer_client_stop_requested(const pacer_client* client);
/* EXCLUDE_WORKERS (honors_exclusion set): 1 while the job's steps do not wait for this worker,
 * else 0 (also for NULL). Flips at heartbeat replies; read it once per step. While it is 1 the
 * trainer (1) calls pacer_reader_release_all once, after the records handed out are trained,
 * (2) joins every all-reduce with weight 0, (3) still times a probe of about half its batch
 * every couple of seconds and ends it with pacer_step_timer_end, so pacerd sees it recover.
 * When it turns 0: pacer_reader_resume and train as before. */
int pacer_client_excluded(const pacer_client* client);
/* The version of the newest exclusion command held (0: none, also for NULL). */
uint64_t pacer_client_exclusion_version(const pacer_client* client);

/* ---- shard reader ---- */
pacer_code pacer_reader_create(pacer_client* client, const char* dataset, pacer_reader** out, pacer_error* err);
void pacer_reader_destroy(pacer_reader* reader);
/* Writes up to `capacity` record ids to `ids`, their number to *count and the outcome. */
pacer_code pacer_reader_next(pacer_reader* reader, size_t capacity, pacer_blocking blocking, uint64_t* ids,
                             size_t* count, pacer_outcome* outcome, pacer_error* err);
/* Every record handed out so far is trained (queues progress; never blocks). */
void pacer_reader_mark_consumed(pacer_reader* reader);
pacer_code pacer_reader_save_checkpoint(pacer_reader* reader, const char* tag, pacer_error* err);
pacer_code pacer_reader_restore_checkpoint(pacer_reader* reader, const char* tag, pacer_error* err);
/* What an excluded worker does: marks every record handed out consumed, waits (up to
 * timeout_ms; <= 0: 10 000) until pacerd acknowledged the progress, hands every lease back at
 * its done prefix and leases nothing until pacer_reader_resume (pacer_reader_next then gives
 * PACER_WAIT at once). *released (may be NULL): how many leases went back. Idempotent; on an
 * error the leases not yet released stay held and leasing stays stopped: call it again. */
pacer_code pacer_reader_release_all(pacer_reader* reader, int64_t timeout_ms, int* released, pacer_error* err);
/* Leasing goes on (after pacer_reader_release_all). NULL is a no-op. */
void pacer_reader_resume(pacer_reader* reader);
/* 1 between pacer_reader_release_all and pacer_reader_resume, else 0 (also for NULL). */
int pacer_reader_holding_off(const pacer_reader* reader);
/* After PACER_END_OF_DATA: records of the dataset quarantined as poison (on_poison: continue),
 * never trained on; 0 when the data ended without a hole (also for NULL). */
uint64_t pacer_reader_records_quarantined(const pacer_reader* reader);

/* ---- step timer ---- */
pacer_code pacer_step_timer_create(pacer_client* client, pacer_step_timer** out, pacer_error* err);
void pacer_step_timer_destroy(pacer_step_timer* timer);
/* Begins a step. Its phases are added after the fact (pacer_step_timer_add), so the client's
 * heartbeats carry the steps this timer ended, not how long a running step has computed (the C++
 * and Python StepTimer do, given the step's samples and phases timed as they happen). */
void pacer_step_timer_begin(pacer_step_timer* timer, uint64_t step);
void pacer_step_timer_add(pacer_step_timer* timer, pacer_phase phase, int64_t ns);
/* Ends the step and queues its report on the client. */
void pacer_step_timer_end(pacer_step_timer* timer, uint32_t local_batch, uint64_t samples);

#ifdef __cplusplus
}
#endif

#endif /* PACER_WORKER_SDK_C_API_H_ */
