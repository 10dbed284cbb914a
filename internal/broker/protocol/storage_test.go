package protocol

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/internal/broker"
)

// A flipped byte inside an inactive segment: a franz-go consumer reads
// every record before the damaged batch and then gets an error for the
// partition instead of an empty fetch (a silent stall): CORRUPT_MESSAGE by
// default, which franz-go shows with KeepRetryableFetchErrors, or
// UNKNOWN_SERVER_ERROR, which it shows by default. The metrics report the
// range.
func TestKgoConsumerGetsAnErrorForLostData(t *testing.T) {
	t.Parallel()
	t.Run("CORRUPT_MESSAGE", func(t *testing.T) {
		t.Parallel()
		testLostDataFetch(t, 0, kerr.CorruptMessage, kgo.KeepRetryableFetchErrors())
	})
	t.Run("UNKNOWN_SERVER_ERROR", func(t *testing.T) {
		t.Parallel()
		testLostDataFetch(t, kerr.UnknownServerError.Code, kerr.UnknownServerError)
	})
}

func testLostDataFetch(t *testing.T, code int16, want *kerr.Error, opts ...kgo.Opt) {
	f := setupBroker(t, broker.Options{ScrubBytesPerSecond: -1}, func(c *Config) { c.LostDataErrorCode = code })
	ctx := testContext(t, 60*time.Second)
	if _, err := f.b.CreateTopic("lost", broker.TopicConfig{Partitions: 1, SegmentBytes: 4096}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 60; i++ {
		rs := make([]broker.Record, 5)
		for j := range rs {
			rs[j] = broker.Record{Key: []byte("k"), Value: []byte(fmt.Sprintf("v-%d", i*5+j)), Timestamp: time.UnixMilli(1_700_000_000_000)}
		}
		if _, err := f.b.Append(ctx, "lost", 0, broker.EncodeBatch(-1, -1, -1, rs)); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(f.dir, "topics", "lost", "0", fmt.Sprintf("%020d.log", 0))
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var pos int
	var victim broker.BatchHeader
	for i := 0; i < 4; i++ {
		h, err := broker.ParseBatchHeader(data[pos:])
		if err != nil {
			t.Fatal(err)
		}
		victim = h
		if i < 3 {
			pos += h.Size()
		}
	}
	fd, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fd.WriteAt([]byte{data[pos+victim.Size()/2] ^ 0x20}, int64(pos+victim.Size()/2)); err != nil {
		t.Fatal(err)
	}
	fd.Close()

	cl := newKgo(t, f.addr, append([]kgo.Opt{kgo.ConsumeTopics("lost"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(200 * time.Millisecond)}, opts...)...)
	defer cl.Close()
	var got []int64
	var fetchErr error
	for fetchErr == nil {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("no error after %d records", len(got))
		}
		for _, e := range fs.Errors() {
			if errors.Is(e.Err, want) {
				fetchErr = e.Err
			} else if !errors.Is(e.Err, context.DeadlineExceeded) {
				t.Fatalf("fetch error %v", e.Err)
			}
		}
		fs.EachRecord(func(r *kgo.Record) { got = append(got, r.Offset) })
	}
	if int64(len(got)) != victim.BaseOffset {
		t.Fatalf("consumed %d records before the error, want the %d before the damaged batch", len(got), victim.BaseOffset)
	}
	for i, off := range got {
		if off != int64(i) {
			t.Fatalf("record %d has offset %d", i, off)
		}
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(f.srv.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += "," + l.GetName() + "=" + l.GetValue()
			}
			vals[name] = m.GetGauge().GetValue()
		}
	}
	rangeName := fmt.Sprintf("relay_broker_lost_range_records,first_offset=%d,last_offset=%d,partition=0,topic=lost", victim.BaseOffset, victim.LastOffset())
	if vals["relay_broker_lost_records"] != 5 || vals["relay_broker_lost_ranges"] != 1 || vals[rangeName] != 5 ||
		vals["relay_broker_storage_healthy"] != 1 {
		t.Fatalf("metrics: %v", vals)
	}
}

// gatherNames returns the exported series as name -> label sets.
func gatherNames(t *testing.T, c prometheus.Collector) map[string][]map[string]string {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]map[string]string{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if h := m.GetHistogram(); h != nil {
				labels["count"] = fmt.Sprint(h.GetSampleCount())
			}
			out[mf.GetName()] = append(out[mf.GetName()], labels)
		}
	}
	return out
}

// TestPartitionSeriesOptIn: with more partitions than PartitionSeries.Max
// the per-partition storage series are gone and the per-topic sums stay
// (with the right totals), and Always brings them back; the fsync
// histograms are exported by file, with the appends' journal fsyncs
// counted.
func TestPartitionSeriesOptIn(t *testing.T) {
	t.Parallel()
	f := setupBroker(t, broker.Options{}, nil)
	ctx := testContext(t, 30*time.Second)
	if _, err := f.b.CreateTopic("many", broker.TopicConfig{Partitions: 3}); err != nil {
		t.Fatal(err)
	}
	for p := int32(0); p < 3; p++ {
		rs := []broker.Record{{Key: []byte("k"), Value: []byte("v"), Timestamp: time.UnixMilli(1_700_000_000_000)}}
		if _, err := f.b.Append(ctx, "many", p, broker.EncodeBatch(-1, -1, -1, rs)); err != nil {
			t.Fatal(err)
		}
	}
	off := gatherNames(t, StorageCollector(f.b, PartitionSeries{Max: 2}))
	for _, name := range []string{"relay_broker_partition_records_appended_total", "relay_broker_partition_appended_bytes_total", "relay_broker_partition_bytes"} {
		if len(off[name]) != 0 {
			t.Errorf("%s exported above the partition limit: %v", name, off[name])
		}
	}
	if len(off["relay_broker_topic_records_appended_total"]) != 1 || len(off["relay_broker_topic_bytes"]) != 1 || len(off["relay_broker_topic_appended_bytes_total"]) != 1 {
		t.Errorf("per-topic series: %v", off)
	}
	if len(off["relay_broker_partition_series_exported"]) != 1 {
		t.Errorf("no relay_broker_partition_series_exported")
	}
	files := map[string]string{}
	for _, l := range off["relay_broker_fsync_duration_seconds"] {
		files[l["file"]] = l["count"]
	}
	if len(files) != len(broker.FsyncFiles) || files[broker.FsyncJournal] == "0" {
		t.Errorf("fsync histograms by file: %v", files)
	}
	for name, parts := range map[PartitionSeries]int{{Max: 2, Always: true}: 3, {Max: 3}: 3, {}: 3} {
		on := gatherNames(t, StorageCollector(f.b, name))
		if got := len(on["relay_broker_partition_records_appended_total"]); got != parts {
			t.Errorf("%+v: %d per-partition series, want %d", name, got, parts)
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(StorageCollector(f.b, PartitionSeries{Max: 2}))
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "relay_broker_topic_records_appended_total" {
			if v := mf.GetMetric()[0].GetCounter().GetValue(); v != 3 {
				t.Errorf("relay_broker_topic_records_appended_total %v, want 3", v)
			}
		}
	}
}
