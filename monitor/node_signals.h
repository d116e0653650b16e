// NodeSignals: the latest metrics of every node and what they say about contention.
//
// A node is contended when any signal crosses its policy threshold: hypervisor CPU steal,
// cgroup throttling (throttled seconds / interval), CPU used by co-located processes that are
// not this job's workers, or load per CPU. The contention score is the largest signal divided
// by its threshold, so a score >= 1 means "contended" and its size says by how much. Metrics
// older than node_metrics_max_age_ms count as no signal (an agent that went quiet must not keep
// a node marked contended, or clean, forever).
//
// Nodes are dense indices handed out by AddNode(). Thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "monitor/monitor_options.h"
#include "proto/pacer/monitor.pb.h"

namespace pacer {

struct Contention {
  double score = 0;      // max(signal / threshold); >= 1: contended
  std::string evidence;  // e.g. "steal 12.0% (>5.0%), throttled 0.0%"; empty with no metrics
  bool contended() const { return score >= 1.0; }
};

class NodeSignals {
 public:
  explicit NodeSignals(const MonitorOptions& options) : options_(options) {}
  void SetOptions(const MonitorOptions& options) { options_ = options; }  // hot reload

  uint32_t AddNode();
  // Forgets node `node`'s metrics: its index is reused for another node (MonitorState frees the
  // row of a node no worker or agent names any more).
  void Reset(uint32_t node) { nodes_[node] = Node(); }
  size_t num_nodes() const { return nodes_.size(); }

  // Stores already validated metrics (CheckNodeMetrics) received at `now_ms`.
  void Update(uint32_t node, const NodeMetrics& metrics, int64_t now_ms);
  // The node's contention score and, with `with_evidence`, its evidence text. Formatting the
  // text is most of the cost, and a window close at 1 000+ nodes needs it only for the nodes
  // that are contended (the classifier quotes it for their stragglers).
  Contention Assess(uint32_t node, int64_t now_ms, bool with_evidence = true) const;
  // The latest metrics (empty message when none).
  const NodeMetrics& Latest(uint32_t node) const { return nodes_[node].metrics; }

  size_t MemoryBytes() const;

 private:
  struct Node {
    NodeMetrics metrics;
    int64_t received_ms = -1;
  };
  MonitorOptions options_;
  std::vector<Node> nodes_;
};

}  // namespace pacer
