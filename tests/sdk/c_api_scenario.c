/* Compiled as C: uses only worker_sdk/c_api.h. Called by c_api_test.cc with a live pacerd.
 * Returns 0 when every check holds, else the number of the failed check; `log` gets a line. */
#include <stdio.h>
#include <string.h>

#include "worker_sdk/c_api.h"

enum { kExRecords = 400, kExShard = 50, kExBatch = 25 };

/* Reads through `reader` in batches of kExBatch (divides the shard: never spans the last lease) until
 * `max_records` are read or the data ends; counts each id in `seen`. Returns 0, or -1 with `log`
 * set. *ended is 1 at PACER_END_OF_DATA. */
static int read_some(pacer_reader* reader, size_t max_records, unsigned char* seen, size_t* total, int* ended,
                     char* log, size_t log_len) {
  pacer_error err;
  uint64_t ids[kExBatch];
  *ended = 0;
  for (size_t got = 0; got < max_records;) {
    size_t n = 0;
    pacer_outcome outcome;
    if (pacer_reader_next(reader, kExBatch, PACER_UNTIL_DATA, ids, &n, &outcome, &err) != PACER_OK) {
      snprintf(log, log_len, "exclusion next: %s", err.message);
      return -1;
    }
    for (size_t i = 0; i < n; ++i) {
      if (ids[i] >= kExRecords || seen[ids[i]]++) {
        snprintf(log, log_len, "exclusion: record %llu out of range or twice", (unsigned long long)ids[i]);
        return -1;
      }
    }
    got += n;
    *total += n;
    pacer_reader_mark_consumed(reader);
    if (n == 0) {
      if (outcome != PACER_END_OF_DATA) {
        snprintf(log, log_len, "exclusion: no records but outcome %d", (int)outcome);
        return -1;
      }
      *ended = 1;
      return 0;
    }
  }
  return 0;
}

static int exclusion_scenario(pacer_client_options* o, char* log, size_t log_len) {
  pacer_error err;
  static unsigned char seen[kExRecords];
  memset(seen, 0, sizeof seen);
  size_t total = 0;
  int ended = 0;
  o->honors_exclusion = 1;
  o->worker_id = "c-excl-a";
  pacer_client* a = NULL;
  if (pacer_client_connect(o, &a, &err) != PACER_OK) {
    snprintf(log, log_len, "exclusion connect a: %s", err.message);
    return 20;
  }
  if (pacer_client_excluded(a) != 0 || pacer_client_exclusion_version(a) != 0 || pacer_client_excluded(NULL) != 0 ||
      pacer_client_exclusion_version(NULL) != 0) {
    snprintf(log, log_len, "excluded before pacerd decided it");
    return 21;
  }
  if (pacer_client_register_dataset(a, "ex", kExRecords, kExShard, 1, 5, NULL, &err) != PACER_OK) return 22;
  pacer_reader* ra = NULL;
  if (pacer_reader_create(a, "ex", &ra, &err) != PACER_OK) return 23;
  /* Bad input: NULL reader. */
  if (pacer_reader_release_all(NULL, 1000, NULL, &err) != PACER_INVALID_ARGUMENT || pacer_reader_holding_off(NULL) != 0)
    return 24;
  pacer_reader_resume(NULL); /* no-op */
  /* 75 records: the second lease is half read, so at least that one goes back. */
  if (read_some(ra, 75, seen, &total, &ended, log, log_len) != 0) return 25;
  if (ended || total != 75) {
    snprintf(log, log_len, "exclusion: read %zu before release", total);
    return 26;
  }
  int released = -1;
  if (pacer_reader_release_all(ra, 10000, &released, &err) != PACER_OK || released < 1) {
    snprintf(log, log_len, "release_all: code %d '%s' released %d", (int)err.code, err.message, released);
    return 27;
  }
  if (pacer_reader_holding_off(ra) != 1) return 28;
  /* Holding off: nothing is leased, next says WAIT at once (even when asked to block). */
  {
    uint64_t ids[kExShard];
    size_t n = 1;
    pacer_outcome outcome = PACER_RECORDS;
    if (pacer_reader_next(ra, kExShard, PACER_UNTIL_DATA, ids, &n, &outcome, &err) != PACER_OK || n != 0 ||
        outcome != PACER_WAIT) {
      snprintf(log, log_len, "holding off: n %zu outcome %d", n, (int)outcome);
      return 29;
    }
  }
  /* Idempotent: a second call releases nothing more. */
  if (pacer_reader_release_all(ra, 10000, &released, &err) != PACER_OK || released != 0) return 30;
  /* Another worker finishes the dataset: the released leases went back. */
  o->worker_id = "c-excl-b";
  pacer_client* b = NULL;
  if (pacer_client_connect(o, &b, &err) != PACER_OK) return 31;
  pacer_reader* rb = NULL;
  if (pacer_reader_create(b, "ex", &rb, &err) != PACER_OK) return 32;
  if (read_some(rb, kExRecords, seen, &total, &ended, log, log_len) != 0) return 33;
  if (!ended || total != kExRecords) {
    snprintf(log, log_len, "exclusion: %zu of %d records read, ended %d", total, kExRecords, ended);
    return 34;
  }
  /* Included again: leasing goes on, and finds the data done. */
  pacer_reader_resume(ra);
  if (pacer_reader_holding_off(ra) != 0) return 35;
  if (read_some(ra, kExRecords, seen, &total, &ended, log, log_len) != 0) return 36;
  if (!ended || total != kExRecords) return 37;
  pacer_reader_destroy(rb);
  pacer_reader_destroy(ra);
  pacer_client_destroy(b, 5000);
  pacer_client_destroy(a, 5000);
  return 0;
}

int pacer_c_api_scenario(const char* address, const char* token, char* log, size_t log_len) {
  pacer_error err;
  pacer_client* client = NULL;
  pacer_client_options o;
  memset(&o, 0, sizeof o);
  o.address = address;
  o.worker_id = "c-worker";

  /* 1: a wrong token is UNAUTHENTICATED with a message, and no handle. */
  o.token = "wrong";
  if (pacer_client_connect(&o, &client, &err) != PACER_UNAUTHENTICATED || client != NULL ||
      err.message[0] == '\0') {
    snprintf(log, log_len, "wrong token: code %d '%s'", (int)err.code, err.message);
    return 1;
  }
  /* 2: NULL arguments are INVALID_ARGUMENT, not a crash. */
  if (pacer_client_connect(&o, NULL, &err) != PACER_INVALID_ARGUMENT ||
      pacer_reader_create(NULL, "x", NULL, &err) != PACER_INVALID_ARGUMENT) {
    return 2;
  }
  /* 3: connect, register, read every record once. */
  o.token = token;
  o.initial_micro_batch = 16;
  if (pacer_client_connect(&o, &client, &err) != PACER_OK) {
    snprintf(log, log_len, "connect: %s", err.message);
    return 3;
  }
  int created = -1;
  if (pacer_client_register_dataset(client, "c", 500, 50, 1, 3, &created, &err) != PACER_OK || created != 1) {
    snprintf(log, log_len, "register: %s", err.message);
    return 4;
  }
  uint32_t micro = 0, accum = 0;
  if (pacer_client_batch_plan(client, 0, &micro, &accum, &err) != PACER_OK || micro != 16 || accum != 1) return 5;
  pacer_reader* reader = NULL;
  if (pacer_reader_create(client, "c", &reader, &err) != PACER_OK) return 6;
  pacer_step_timer* timer = NULL;
  if (pacer_step_timer_create(client, &timer, &err) != PACER_OK) return 7;
  static unsigned char seen[500];
  memset(seen, 0, sizeof seen);
  uint64_t ids[50];
  size_t total = 0;
  for (uint64_t step = 0;; ++step) {
    size_t n = 0;
    pacer_outcome outcome;
    pacer_step_timer_begin(timer, step);
    /* 50 divides the shard size, so a batch never spans the last lease (see c_api.h). */
    if (pacer_reader_next(reader, 50, PACER_UNTIL_DATA, ids, &n, &outcome, &err) != PACER_OK) {
      snprintf(log, log_len, "next: %s", err.message);
      return 8;
    }
    if (n == 0) {
      if (outcome != PACER_END_OF_DATA) return 9;
      break;
    }
    for (size_t i = 0; i < n; ++i) {
      if (ids[i] >= 500 || seen[ids[i]]++) {
        snprintf(log, log_len, "record %llu out of range or twice", (unsigned long long)ids[i]);
        return 10;
      }
    }
    total += n;
    pacer_reader_mark_consumed(reader);
    pacer_step_timer_end(timer, 50, n);
  }
  if (total != 500) return 11;
  if (pacer_client_flush(client, 30000, &err) != PACER_OK) return 12;
  /* 4: an unknown dataset is an error with the name in the message. */
  pacer_reader* bad = NULL;
  if (pacer_reader_create(client, "no-such", &bad, &err) != PACER_OK) return 13;
  size_t n = 0;
  pacer_outcome outcome;
  if (pacer_reader_next(bad, 10, PACER_UNTIL_DATA, ids, &n, &outcome, &err) == PACER_OK ||
      strstr(err.message, "no-such") == NULL) {
    snprintf(log, log_len, "unknown dataset: code %d '%s'", (int)err.code, err.message);
    return 14;
  }
  pacer_reader_destroy(bad);
  pacer_step_timer_destroy(timer);
  pacer_reader_destroy(reader);
  pacer_client_destroy(client, 5000);

  /* 5: exclusion. A client that opts in is not excluded until pacerd says so; release_all hands
   * its leases back (leasing stops until resume), so another worker finishes the dataset and
   * every record is read exactly once across the two. */
  int rc = exclusion_scenario(&o, log, log_len);
  if (rc != 0) return rc;
  snprintf(log, log_len, "ok: %zu records", total);
  return 0;
}
