// Snapshot format 4, "specs apart": a snapshot holds the dynamic state and names each dataset's
// spec; the journal keeps the spec as a pinned entry written once. Checked here: capturing a
// snapshot shares the specs (no file list copied), the snapshot is small, it loads back to the
// same state, format 0 (v2/v3, specs inline) still loads, damage and unknown formats are
// refused, and through the service each spec is written to the journal once however many
// snapshots follow, and a restart rebuilds the same state. ListDatasets without files copies no
// file list yet keeps every other field of the spec.
#include <google/protobuf/descriptor.h>
#include <gtest/gtest.h>

#include <future>

#include "common/clock.h"
#include "sharding_service/sharding_service.h"
#include "tests/sharding/state_driver.h"
#include "tests/testing/test_util.h"

namespace pacer {
namespace {

using testing::StateDriver;

constexpr int kFiles = 20'000;

DatasetSpec FilesSpec(const std::string& name, int files) {
  DatasetSpec s;
  s.set_name(name);
  for (int i = 0; i < files; ++i) {
    FileSpec* f = s.mutable_files()->add_files();
    f->set_path("/data/" + name + "/part-" + std::to_string(i) + ".tfrecord");
    f->set_num_records(10);
  }
  s.set_shard_size(50);
  s.set_num_epochs(2);
  return s;
}

// A state with a large file dataset, a small one, a worker and some leases.
void Populate(StateDriver& d) {
  ASSERT_TRUE(d.AddDataset(FilesSpec("big", kFiles)).ok());
  ASSERT_TRUE(d.AddDataset(FilesSpec("small", 3)).ok());
  d.AddWorker("w0");
  auto a = d.Fetch("w0", "big");
  ASSERT_TRUE(a.has_value());
  ASSERT_TRUE(d.Complete(a->id).ok());
  ASSERT_TRUE(d.Fetch("w0", "big").has_value());
  ASSERT_TRUE(d.Fetch("w0", "small").has_value());
}

TEST(SnapshotFormatTest, AJournalSnapshotSharesTheSpecsIsSmallAndLoadsBackToTheSameState) {
  StateDriver d;
  Populate(d);
  if (HasFatalFailure()) return;
  const ShardingState& st = d.state();
  const ShardingState::JournalSnapshot js = st.ToJournalSnapshot();
  EXPECT_EQ(js.snapshot.format(), ShardingState::kSnapshotFormatSpecsApart);
  ASSERT_EQ(js.specs.size(), 2u);
  // Shared, not copied: the very object the state holds.
  EXPECT_EQ(js.specs.at(ShardingState::SpecKey("big")).get(), st.FindDataset("big")->spec.get());
  for (const auto& ds : js.snapshot.datasets()) EXPECT_FALSE(ds.has_spec());
  const size_t inline_size = st.ToSnapshot().ByteSizeLong();
  EXPECT_LT(js.snapshot.ByteSizeLong(), 2048u) << "the snapshot carries more than dynamic state";
  EXPECT_GT(inline_size, 500'000u);

  auto back = ShardingState::FromSnapshot(js.snapshot, js.specs);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ToSnapshot().SerializeAsString(), st.ToSnapshot().SerializeAsString());
  // Through bytes, as the journal stores them (pinned entries, then the snapshot).
  ShardingState::SpecsByKey parsed;
  for (const auto& [key, spec] : js.specs) {
    ASSERT_TRUE(ShardingState::AddPinnedSpec(key, spec->SerializeAsString(), &parsed).ok());
  }
  ShardingSnapshot wire;
  ASSERT_TRUE(wire.ParseFromString(js.snapshot.SerializeAsString()));
  auto from_wire = ShardingState::FromSnapshot(wire, parsed);
  ASSERT_TRUE(from_wire.ok()) << from_wire.status();
  EXPECT_EQ(from_wire->ToSnapshot().SerializeAsString(), st.ToSnapshot().SerializeAsString());
  // Format 0 (what v2/v3 journals hold, specs inline) still loads.
  auto old = ShardingState::FromSnapshot(st.ToSnapshot());
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->ToSnapshot().SerializeAsString(), st.ToSnapshot().SerializeAsString());
}

TEST(SnapshotFormatTest, AMissingOrForeignSpecAndAnUnknownFormatAreRefused) {
  StateDriver d;
  Populate(d);
  if (HasFatalFailure()) return;
  const ShardingState::JournalSnapshot js = d.state().ToJournalSnapshot();
  ShardingState::SpecsByKey missing = js.specs;
  missing.erase(ShardingState::SpecKey("small"));
  auto st = ShardingState::FromSnapshot(js.snapshot, missing);
  EXPECT_EQ(st.status().code(), absl::StatusCode::kDataLoss) << st.status();
  EXPECT_NE(st.status().message().find("spec/small"), std::string::npos) << st.status();

  ShardingState::SpecsByKey specs;
  EXPECT_EQ(ShardingState::AddPinnedSpec("spec/big", "\xff\xff garbage", &specs).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(ShardingState::AddPinnedSpec("spec/big", FilesSpec("other", 1).SerializeAsString(), &specs)
                .code(),
            absl::StatusCode::kDataLoss);
  EXPECT_TRUE(ShardingState::AddPinnedSpec("not-a-spec/x", "anything", &specs).ok());
  EXPECT_TRUE(specs.empty());

  ShardingSnapshot future = js.snapshot;
  future.set_format(9);
  auto f = ShardingState::FromSnapshot(future, js.specs);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kFailedPrecondition) << f.status();
}

TEST(SnapshotFormatTest, ADatasetDescribedWithoutFilesKeepsEveryOtherFieldOfItsSpec) {
  // Every field of DatasetSpec set (by reflection, so a field added later is covered too).
  DatasetSpec spec = FilesSpec("d", 5);
  const auto* desc = DatasetSpec::descriptor();
  const auto* refl = spec.GetReflection();
  for (int i = 0; i < desc->field_count(); ++i) {
    const auto* f = desc->field(i);
    if (f->containing_oneof() != nullptr || f->is_repeated()) continue;
    switch (f->cpp_type()) {
      case google::protobuf::FieldDescriptor::CPPTYPE_UINT32: refl->SetUInt32(&spec, f, 7 + i); break;
      case google::protobuf::FieldDescriptor::CPPTYPE_UINT64: refl->SetUInt64(&spec, f, 7 + i); break;
      case google::protobuf::FieldDescriptor::CPPTYPE_INT32: refl->SetInt32(&spec, f, 7 + i); break;
      case google::protobuf::FieldDescriptor::CPPTYPE_INT64: refl->SetInt64(&spec, f, 7 + i); break;
      case google::protobuf::FieldDescriptor::CPPTYPE_BOOL: refl->SetBool(&spec, f, true); break;
      case google::protobuf::FieldDescriptor::CPPTYPE_STRING:
        if (f->name() != "name") refl->SetString(&spec, f, "x");
        break;
      case google::protobuf::FieldDescriptor::CPPTYPE_ENUM:
        refl->SetEnumValue(&spec, f, f->enum_type()->value(f->enum_type()->value_count() - 1)->number());
        break;
      default:
        ADD_FAILURE() << "DatasetSpec." << f->name() << ": a field kind this test does not set";
    }
  }
  ShardingState::Dataset ds;
  ds.spec = std::make_shared<const DatasetSpec>(spec);
  ShardingState st;
  DatasetInfo with = st.DescribeDataset(ds, /*include_files=*/true);
  const DatasetInfo without = st.DescribeDataset(ds, /*include_files=*/false);
  EXPECT_EQ(with.num_files(), 5);
  with.mutable_spec()->mutable_files()->clear_files();
  EXPECT_EQ(without.SerializeAsString(), with.SerializeAsString())
      << "DescribeDataset(include_files=false) drops a field: " << without.ShortDebugString();
  EXPECT_TRUE(without.spec().has_files());
}

constexpr auto Call = [](auto&&... a) { return CallAndWait(a...); };

TEST(SnapshotFormatTest, ThroughTheServiceEachSpecIsWrittenOnceAndARestartRebuildsTheSameState) {
  testing::TempDir dir;
  SimulatedClock clock;
  ShardingServiceOptions o;
  o.data_dir = dir.Sub("journal");
  o.snapshot_every = 4;
  o.sync = false;
  o.lease_timeout_ms = 3'600'000;
  o.worker_timeout_ms = 3'600'000;
  const uint64_t spec_bytes = FilesSpec("big", kFiles).ByteSizeLong();
  auto svc = ShardingServiceImpl::Open(o, &clock, nullptr);
  ASSERT_TRUE(svc.ok()) << svc.status();
  RegisterDatasetRequest rd;
  *rd.mutable_spec() = FilesSpec("big", kFiles);
  RegisterDatasetResponse rdr;
  ASSERT_TRUE(Call(**svc, &ShardingServiceImpl::RegisterDataset, rd, &rdr).ok());
  RegisterWorkerRequest rw;
  rw.set_worker_id("w0");
  RegisterWorkerResponse rwr;
  ASSERT_TRUE(Call(**svc, &ShardingServiceImpl::RegisterWorker, rw, &rwr).ok());
  auto consume = [&](int shards) {
    for (int i = 0; i < shards; ++i) {
      FetchShardRequest f;
      f.set_worker_id("w0");
      f.set_incarnation(rwr.incarnation());
      f.set_dataset("big");
      FetchShardResponse fr;
      ASSERT_TRUE(Call(**svc, &ShardingServiceImpl::FetchShard, f, &fr).ok());
      ASSERT_EQ(fr.outcome(), FetchShardResponse::LEASED);
      CompleteShardRequest c;
      c.set_worker_id("w0");
      c.set_incarnation(rwr.incarnation());
      c.set_lease_id(fr.lease().lease_id());
      c.set_fencing_token(fr.lease().fencing_token());
      CompleteShardResponse cr;
      ASSERT_TRUE(Call(**svc, &ShardingServiceImpl::CompleteShard, c, &cr).ok());
    }
  };
  consume(20);  // 42 updates: 10 snapshots
  ASSERT_TRUE((*svc)->Flush().ok());
  JournalStats js = (*svc)->stats().journal;
  EXPECT_GE(js.snapshots, 5u);
  EXPECT_EQ(js.pinned_written, 1u) << "the spec is written once, not once per snapshot";
  // The registration update holds the spec once and its pinned entry once; ten snapshots with
  // specs inline would have added ten more.
  EXPECT_LT(js.bytes, 2 * spec_bytes + spec_bytes / 2) << "a snapshot rewrote the file list";

  // A second dataset: its spec is pinned by the next snapshot, the first one is not rewritten.
  RegisterDatasetRequest small;
  *small.mutable_spec() = FilesSpec("small", 2);
  ASSERT_TRUE(Call(**svc, &ShardingServiceImpl::RegisterDataset, small, &rdr).ok());
  consume(3);
  ASSERT_TRUE((*svc)->Flush().ok());
  EXPECT_EQ((*svc)->stats().journal.pinned_written, 2u);

  // ListDatasets without files: no file list, and the count.
  ListDatasetsRequest lr;
  ListDatasetsResponse list;
  ASSERT_TRUE(Call(**svc, &ShardingServiceImpl::ListDatasets, lr, &list).ok());
  ASSERT_EQ(list.datasets_size(), 2);
  EXPECT_EQ(list.datasets(0).spec().files().files_size(), 0);
  EXPECT_EQ(list.datasets(0).num_files(), kFiles);
  EXPECT_EQ(list.datasets(0).spec().shard_size(), 50u);

  // A restart: pinned specs, the newest snapshot, the tail — the same state, specs included.
  const ShardingSnapshot before = (*svc)->SnapshotForTest();
  svc->reset();
  auto again = ShardingServiceImpl::Open(o, &clock, nullptr);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_LT((*again)->stats().recovered_updates, 5u) << "recovery did not start from a snapshot";
  EXPECT_EQ((*again)->SnapshotForTest().SerializeAsString(), before.SerializeAsString());
}

}  // namespace
}  // namespace pacer
