package protocol

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// appendAt appends one record per timestamp, each in a batch of its own,
// with a value of size bytes.
func appendAt(t *testing.T, b *broker.Broker, topic string, part int32, size int, at ...time.Time) {
	t.Helper()
	for _, ts := range at {
		batch, err := broker.AppendBatch(nil, broker.BatchOptions{ProducerID: -1}, []broker.Record{{Timestamp: ts, Value: []byte(strings.Repeat("v", size))}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Append(context.Background(), topic, part, batch); err != nil {
			t.Fatal(err)
		}
	}
}

// TestListOffsetsEveryVersion drives ListOffsets at every version the
// listener advertises (0, which Burrow sends, to 10), with each special
// timestamp
// and a time: a version answers those it defines as Kafka without tiered
// storage does, and refuses the later ones per partition with
// INVALID_REQUEST. Max-timestamp (-3) finds the first record with the
// largest timestamp whether it is in an older segment (partition 0, one
// batch per segment) or the active one (partition 2), and -1 in an empty
// partition.
func TestListOffsetsEveryVersion(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	if _, err := f.b.CreateTopic("times", broker.TopicConfig{Partitions: 3, SegmentBytes: 1024, RetentionMs: -1}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	at := func(minutes ...int) []time.Time {
		var out []time.Time
		for _, m := range minutes {
			out = append(out, t0.Add(time.Duration(m)*time.Minute))
		}
		return out
	}
	appendAt(t, f.b, "times", 0, 700, at(5, 1, 9, 9, 3)...)
	appendAt(t, f.b, "times", 2, 10, at(4, 7, 7, 2)...)
	if ti, _ := f.b.Topic("times"); ti.Partitions[0].Segments < 5 {
		t.Fatalf("partition 0 has %d segments; want one per batch", ti.Partitions[0].Segments)
	}
	if r := supportedVersions[kmsg.ListOffsets.Int16()]; r.min != 0 || r.max != 10 {
		t.Fatalf("ListOffsets advertised as v%d to v%d, want v0 to v10", r.min, r.max)
	}
	type want struct {
		part          int32
		ts            int64
		since         int16
		offset, stamp int64
	}
	cases := []want{
		{0, listEarliest, 0, 0, -1},
		{0, listLatest, 0, 5, -1},
		{0, at(2)[0].UnixMilli(), 0, 0, at(5)[0].UnixMilli()},
		{0, listMaxTime, 7, 2, at(9)[0].UnixMilli()},
		{1, listMaxTime, 7, -1, -1},
		{2, listMaxTime, 7, 1, at(7)[0].UnixMilli()},
		{0, listEarliestLocal, 8, 0, -1},
		{1, listEarliestLocal, 8, 0, -1},
		{0, listLatestTiered, 9, -1, -1},
		{0, listEarliestUpload, 99, 0, 0},
	}
	rc := dialRaw(t, f.addr)
	for v := int16(0); v <= 10; v++ {
		req := kmsg.NewPtrListOffsetsRequest()
		req.Version, req.ReplicaID = v, -1
		for _, c := range cases {
			rt := kmsg.NewListOffsetsRequestTopic()
			rt.Topic = "times"
			rp := kmsg.NewListOffsetsRequestTopicPartition()
			rp.Partition, rp.Timestamp = c.part, c.ts
			rt.Partitions = append(rt.Partitions, rp)
			req.Topics = append(req.Topics, rt)
		}
		rc.send(req)
		resp := req.ResponseKind().(*kmsg.ListOffsetsResponse)
		rc.recv(resp)
		if len(resp.Topics) != len(cases) {
			t.Fatalf("v%d: %d answers, want %d", v, len(resp.Topics), len(cases))
		}
		for i, c := range cases {
			p := resp.Topics[i].Partitions[0]
			if v < c.since {
				if p.ErrorCode != kerr.InvalidRequest.Code {
					t.Errorf("v%d partition %d timestamp %d: error %d, want INVALID_REQUEST", v, c.part, c.ts, p.ErrorCode)
				}
				continue
			}
			if v == 0 {
				// v0 answers a list: one offset, none when none is found.
				wantList := []int64{}
				if c.offset >= 0 {
					wantList = append(wantList, c.offset)
				}
				if p.ErrorCode != 0 || !slices.Equal(p.OldStyleOffsets, wantList) {
					t.Errorf("v0 partition %d timestamp %d: error %d offsets %v; want %v", c.part, c.ts, p.ErrorCode, p.OldStyleOffsets, wantList)
				}
				continue
			}
			if p.ErrorCode != 0 || p.Offset != c.offset || p.Timestamp != c.stamp {
				t.Errorf("v%d partition %d timestamp %d: error %d offset %d timestamp %d; want offset %d timestamp %d",
					v, c.part, c.ts, p.ErrorCode, p.Offset, p.Timestamp, c.offset, c.stamp)
			}
		}
	}
}

// TestListMaxTimestampKadm: franz-go's admin client asks for the record
// with the largest timestamp (kadm.ListMaxTimestampOffsets, KIP-734) and the
// local log start (ListLocalLogStartOffsets, KIP-405), once refused as
// UNSUPPORTED_VERSION. Under read_committed a largest timestamp in an open
// transaction is not answered (-1, as Kafka filters by the last stable
// offset) until the transaction commits.
func TestListMaxTimestampKadm(t *testing.T) {
	t.Parallel()
	const topic = "max-ts"
	f, ctx := setupTopic(t, topic, 1, 30*time.Second)
	now := time.Now().Truncate(time.Millisecond)
	plain := newKgo(t, f.addr, kgo.DefaultProduceTopic(topic))
	defer plain.Close()
	for i, ts := range []time.Time{now.Add(-time.Minute), now.Add(time.Minute), now} {
		if err := plain.ProduceSync(ctx, &kgo.Record{Value: []byte{byte('a' + i)}, Timestamp: ts}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.b.DeleteRecords(topic, 0, 1); err != nil {
		t.Fatal(err)
	}
	adm := kadm.NewClient(plain)
	check := func(what string, listed kadm.ListedOffsets, err error, offset, stamp int64) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		o, ok := listed.Lookup(topic, 0)
		if !ok || o.Err != nil || o.Offset != offset || o.Timestamp != stamp {
			t.Fatalf("%s: %+v (found %v), want offset %d timestamp %d", what, o, ok, offset, stamp)
		}
	}
	listed, err := adm.ListMaxTimestampOffsets(ctx, topic)
	check("max timestamp", listed, err, 1, now.Add(time.Minute).UnixMilli())
	listed, err = adm.ListLocalLogStartOffsets(ctx, topic)
	check("local log start", listed, err, 1, -1)

	txn := newKgo(t, f.addr, kgo.TransactionalID("max-ts"), kgo.DefaultProduceTopic(topic))
	defer txn.Close()
	if err := txn.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := txn.ProduceSync(ctx, &kgo.Record{Value: []byte("later"), Timestamp: now.Add(time.Hour)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	// kadm asks under read_uncommitted; a consumer's request under
	// read_committed, as franz-go sends it:
	committedMax := func() (kadm.ListedOffsets, error) {
		req := kmsg.NewPtrListOffsetsRequest()
		req.IsolationLevel = 1
		rt := kmsg.NewListOffsetsRequestTopic()
		rt.Topic = topic
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Timestamp = listMaxTime
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, plain)
		if err != nil {
			return nil, err
		}
		p := resp.Topics[0].Partitions[0]
		return kadm.ListedOffsets{topic: {0: {Topic: topic, Offset: p.Offset, Timestamp: p.Timestamp, Err: kerr.ErrorForCode(p.ErrorCode)}}}, nil
	}
	listed, err = committedMax()
	check("max timestamp, read_committed, open transaction", listed, err, -1, -1)
	listed, err = adm.ListMaxTimestampOffsets(ctx, topic)
	check("max timestamp, read_uncommitted, open transaction", listed, err, 3, now.Add(time.Hour).UnixMilli())
	if err := txn.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	listed, err = committedMax()
	check("max timestamp, read_committed, committed", listed, err, 3, now.Add(time.Hour).UnixMilli())
}
