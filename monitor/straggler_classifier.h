// StragglerClassifier: turns each closed window's relative speeds into a classification per
// entity (worker or PS server), following AntDT (docs/design.md §3):
//
//   class        straggler when r < straggler_threshold, leader when r > leader_threshold,
//                else normal; a flagged entity clears only once r is `hysteresis` past the
//                threshold, so a worker sitting on the line does not flap.
//   persistence  persistent when flagged (same class) in >= K of its last W observed windows,
//                else transient.
//   cause        (stragglers) contention when its node's signals are over threshold
//                (NodeSignals); deterministic when persistent, no contention, and its r over
//                the flagged windows varies by at most deterministic_max_cv (a stable,
//                hardware-like slowdown); otherwise unknown.
//   scope        node-level when >= node_level_fraction of the node's observed workers (at
//                least node_level_min_workers) straggle this window; server for PS servers;
//                else worker.
//
// Only observed windows move the K-of-W history (a worker whose steps are longer than a window
// is not "recovered" by a window without reports). An entity not observed for
// stale_after_windows windows becomes UNKNOWN. Confidence combines the margin past the
// threshold and the share of flagged windows. Every change of (class, persistence, cause,
// scope) is returned as a Change; confidence and evidence alone changing is not a change.
//
// Entities are dense indices handed out by AddEntity(). Pure (no clock); thread-compatible.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "monitor/monitor_options.h"
#include "monitor/node_signals.h"
#include "proto/pacer/monitor.pb.h"

namespace pacer {

class StragglerClassifier {
 public:
  static constexpr uint32_t kNoNode = std::numeric_limits<uint32_t>::max();

  struct Thresholds {
    double straggler;
    double leader;  // +infinity: no leaders (servers)
    double hysteresis;
  };
  static Thresholds WorkerThresholds(const MonitorOptions& options);
  static Thresholds ServerThresholds(const MonitorOptions& options);

  StragglerClassifier(const MonitorOptions& options, EntityKind kind);
  // Hot reload (MonitorState::UpdateDetection): thresholds and K-of-W from the next window on;
  // the flag history kept per entity is reinterpreted under the new W.
  void SetOptions(const MonitorOptions& options);

  uint32_t AddEntity(uint32_t node = kNoNode);
  // Forgets what the entity's windows showed (its node stays), as if just added.
  void Forget(uint32_t entity);
  void SetNode(uint32_t entity, uint32_t node) { tracks_[entity].node = node; }
  size_t num_entities() const { return tracks_.size(); }

  // One entity's measurement in the closed window.
  struct Observation {
    uint32_t entity;
    double relative;  // r (servers: median latency / latency)
  };
  struct Change {
    uint32_t entity;
    Classification previous;
    Classification current;
    double relative;
  };

  // Classifies one closed window. `observed` lists the entities with an estimate;
  // `contention[n]` is node n's assessment (may be shorter than the node count: no signal).
  // Appends every change to `changes`.
  void Classify(const std::vector<Observation>& observed, const std::vector<Contention>& contention,
                std::vector<Change>* changes);

  // The entity's classification with its evidence text. Evidence is formatted here, on
  // demand (and for the two sides of every Change), not every window: formatting it for every
  // flagged entity each window was most of the window-close cost at 4 096 workers. Current()
  // is the cheap view for per-window use; its evidence is empty except for UNKNOWN.
  Classification Get(uint32_t entity) const;
  const Classification& Current(uint32_t entity) const { return tracks_[entity].current; }
  uint32_t WindowsFlagged(uint32_t entity) const;
  // Straggler count / observed workers per node in the last classified window.
  uint32_t NodeStragglers(uint32_t node) const;

  size_t MemoryBytes() const;

 private:
  // What the evidence text of a track's current classification quotes (see Evidence()).
  struct EvidenceInputs {
    double r = 0;
    uint32_t flagged = 0;
    uint32_t node_stragglers = 0, node_observed = 0;
    double contention_score = 0;
    std::string contention_evidence;  // the node's text; set for contended stragglers only
    double cv = -1;                   // flagged-window cv of a persistent straggler; <0 none
  };
  std::string NormalEvidence(double r) const;
  std::string Evidence(const Classification& c, const EvidenceInputs& in) const;
  struct Track {
    uint32_t node = kNoNode;
    uint64_t straggler_bits = 0;  // bit 0: latest observed window
    uint64_t leader_bits = 0;
    uint64_t observed = 0;        // observed windows so far
    uint32_t missed = 0;          // consecutive windows without an observation
    float recent_r[64] = {};      // r of the last observed windows, ring by `observed`
    Classification current;
    EvidenceInputs evidence;  // of `current`
  };

  void Decide(const Track& t, double r, bool straggling, bool leading,
              const std::vector<Contention>& contention, bool node_level, Classification* out,
              EvidenceInputs* evidence) const;

  MonitorOptions options_;
  const EntityKind kind_;
  Thresholds thresholds_;
  uint64_t window_mask_;
  std::vector<Track> tracks_;
  std::vector<uint32_t> node_observed_, node_stragglers_;
  std::vector<uint8_t> flags_scratch_;
  EvidenceInputs evidence_scratch_;
  Classification next_scratch_;
  mutable std::vector<double> cv_scratch_;  // Decide()'s flagged-window r values
};

}  // namespace pacer
