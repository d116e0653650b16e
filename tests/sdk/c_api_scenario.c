/* Compiled as C: uses only worker_sdk/c_api.h. Called by c_api_test.cc with a live pacerd.
 * Returns 0 when every check holds, else the number of the failed check; `log` gets a line. */
#include <stdio.h>
#include <string.h>

#include "worker_sdk/c_api.h"

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
  snprintf(log, log_len, "ok: %zu records", total);
  return 0;
}
