package embedded_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/sink/embedded"
	"github.com/outboxrelay/relay/relay"
	"github.com/outboxrelay/relay/relay/relaytest"
)

func messages(from, n int) []relay.Message {
	var out []relay.Message
	for i := from; i < from+n; i++ {
		out = append(out, relay.Message{
			Topic:     "orders",
			Key:       fmt.Appendf(nil, "key-%d", i%7),
			Value:     fmt.Appendf(nil, "event-%d", i),
			Headers:   []relay.Header{{Key: relay.HeaderEventID, Value: fmt.Appendf(nil, "id-%d", i)}},
			Timestamp: time.UnixMilli(int64(1_700_000_000_000 + i)),
		})
	}
	return out
}

// sinkConfig is the tests' sink configuration on dir: 3 partitions a
// topic, no janitor.
func sinkConfig(dir string) embedded.Config {
	return embedded.Config{Broker: broker.Options{Dir: dir, DefaultPartitions: 3, JanitorInterval: -1}}
}

func newSink(t *testing.T, dir string) *embedded.Sink {
	t.Helper()
	return openSink(t, sinkConfig(dir))
}

func openSink(t *testing.T, cfg embedded.Config) *embedded.Sink {
	t.Helper()
	s, err := embedded.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// start starts a session of s from the saved state (nil: a fresh one).
func start(t *testing.T, s *embedded.Sink, state []byte) {
	t.Helper()
	if err := s.Start(context.Background(), relay.Session{State: state}); err != nil {
		t.Fatal(err)
	}
}

// startedSink is newSink started with a session from the saved state
// (nil: a fresh one).
func startedSink(t *testing.T, dir string, state []byte) *embedded.Sink {
	t.Helper()
	s := newSink(t, dir)
	start(t, s, state)
	return s
}

func readAll(t *testing.T, dir string) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for _, r := range e2e.ReadLog(t, dir, "orders") {
		counts[string(r.Value)]++
	}
	return counts
}

// lostAcknowledgement starts a sink on a new directory, publishes events
// 0 to acked-1 and returns the state saved with them, then publishes the
// next lost events, whose acknowledgement is lost: the saved state stays
// before them.
func lostAcknowledgement(t *testing.T, acked, lost int) (s *embedded.Sink, dir string, saved []byte) {
	t.Helper()
	dir = t.TempDir()
	s = startedSink(t, dir, nil)
	saved = publishOK(t, s, messages(0, acked)).State
	publishOK(t, s, messages(acked, lost))
	return s, dir, saved
}

// restarted closes s and starts a new sink on dir from the saved state.
func restarted(t *testing.T, s *embedded.Sink, dir string, state []byte) *embedded.Sink {
	t.Helper()
	s.Close(context.Background())
	return startedSink(t, dir, state)
}

// wantEachOnce checks that events event-0 to event-(n-1) are each in counts
// once.
func wantEachOnce(t *testing.T, counts map[string]int, n int) {
	t.Helper()
	for i := range n {
		if got := counts[fmt.Sprintf("event-%d", i)]; got != 1 {
			t.Errorf("event-%d is in the log %d times", i, got)
		}
	}
}

// fetchBatches returns the batches of topic's partition p from offset off
// on, as one fetch returns them.
func fetchBatches(t *testing.T, b *broker.Broker, topic string, p int32, off int64) [][]byte {
	t.Helper()
	res, err := b.Fetch(context.Background(), topic, p, off, 1<<20)
	if err != nil {
		t.Fatalf("fetch %s/%d@%d: %v", topic, p, off, err)
	}
	var out [][]byte
	for raw, err := range broker.Batches(res.Batches) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, raw)
	}
	return out
}

// logEnds returns the end offsets of the partitions of orders.
func logEnds(t *testing.T, b *broker.Broker) []int64 {
	t.Helper()
	ends := make([]int64, 3)
	for p := range ends {
		_, end, err := b.Offsets("orders", int32(p))
		if err != nil {
			t.Fatal(err)
		}
		ends[p] = end
	}
	return ends
}

// shutdownAndCheck shuts s down and checks that the log on dir holds
// events event-0 to event-(n-1) once each.
func shutdownAndCheck(t *testing.T, s *embedded.Sink, dir string, n int) {
	t.Helper()
	s.Shutdown(context.Background())
	wantEachOnce(t, readAll(t, dir), n)
}

// TestRepublishAfterLostAcknowledgement publishes batches whose
// acknowledgement is then lost (the saved state stays at an earlier
// point), restarts the sink from that state and publishes the same
// messages again, with different batch boundaries: each event must be in
// the log once.
func TestRepublishAfterLostAcknowledgement(t *testing.T) {
	dir := t.TempDir()
	s := startedSink(t, dir, nil)
	saved := publishOK(t, s, messages(0, 10)).State
	// Published, never acknowledged.
	publishOK(t, s, messages(10, 15))
	publishOK(t, s, messages(25, 5))
	s = restarted(t, s, dir, saved)
	// Redelivery in other batch sizes, then new events.
	for _, r := range [][2]int{{10, 7}, {17, 13}, {30, 10}} {
		publishOK(t, s, messages(r[0], r[1]))
	}
	shutdownAndCheck(t, s, dir, 40)
}

// fullDiskFS fails every write to a segment with ENOSPC while full is set.
type fullDiskFS struct {
	broker.OSFS
	full atomic.Bool
}

type fullDiskFile struct {
	broker.File
	fs *fullDiskFS
}

func (f *fullDiskFS) OpenFile(name string, flag int, perm os.FileMode) (broker.File, error) {
	file, err := f.OSFS.OpenFile(name, flag, perm)
	if err != nil || !strings.HasSuffix(name, ".log") {
		return file, err
	}
	return &fullDiskFile{File: file, fs: f}, nil
}

func (f *fullDiskFile) Write(p []byte) (int, error) {
	if f.fs.full.Load() {
		return 0, syscall.ENOSPC
	}
	return f.File.Write(p)
}

// TestSessionWaitsForAFullDisk: a new session starts by making the last
// one's appends durable (here a batch whose wait was abandoned). When a
// full disk fails the segments' writes (the
// bytes stay in memory, no fsync failed), Start fails and keeps the broker
// open, with its Kafka listener; it used to close and reopen it, and with
// the disk still full the reopen failed and the listener stayed down.
// Once there is room, Start succeeds on the same broker and nothing
// published is lost.
func TestSessionWaitsForAFullDisk(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	fsys := &fullDiskFS{}
	cfg := sinkConfig(dir)
	cfg.Broker.FS = fsys
	s := openSink(t, cfg)
	start(t, s, nil)
	res := publishOK(t, s, messages(0, 20))
	// The session ends with a batch appended, its wait abandoned.
	if _, err := s.PublishAsync(ctx, messages(20, 10)); err != nil {
		t.Fatal(err)
	}
	b := s.Broker()
	fsys.full.Store(true)
	s.Close(ctx)
	err := s.Start(ctx, relay.Session{State: res.State})
	if !errors.Is(err, broker.ErrStorage) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("a session started on a full disk: %v", err)
	}
	if s.Broker() != b || b.Health() != nil {
		t.Fatalf("the broker was closed or failed over a full disk: %v", b.Health())
	}
	fsys.full.Store(false)
	if err := s.Start(ctx, relay.Session{State: res.State}); err != nil {
		t.Fatalf("a session started once there was room: %v", err)
	}
	if s.Broker() != b {
		t.Fatal("the broker was reopened")
	}
	publishOK(t, s, messages(20, 20))
	shutdownAndCheck(t, s, dir, 40)
}

// TestHeldEventsSurviveLaterAcknowledgements: events found
// unacknowledged at a session's start may be offered again only after
// later batches are durable (a replay chunk republished first, a WAL
// reader re-reading the table in another order). The state saved with
// those later batches must still name the held events, or a crash before
// they are acknowledged lets the next session append them again: CI's
// TestReplayAcrossTakeovers found events of session epoch 0 appended
// again by epoch 2 that way. Here two sessions in a row die before the
// held events come again.
func TestHeldEventsSurviveLaterAcknowledgements(t *testing.T) {
	s, dir, saved := lostAcknowledgement(t, 5, 5)
	s = restarted(t, s, dir, saved)
	// New events on every partition first; their acknowledgement commits
	// with this state, then the relay dies before the held events 5-9
	// come again. Twice: the held events are carried from state to state.
	saved = publishOK(t, s, messages(10, 20)).State
	if st := decodeState(t, saved); len(st.Held) == 0 {
		t.Errorf("the state saved while events 5-9 are held names none: %s", saved)
	}
	s = restarted(t, s, dir, saved)
	s = restarted(t, s, dir, publishOK(t, s, messages(30, 5)).State)
	res := publishOK(t, s, messages(5, 5))
	// Once the held events came again and are durable, the state names
	// none, and its offsets are the log's ends.
	st := decodeState(t, res.State)
	if len(st.Held) != 0 {
		t.Errorf("the state still names held events after they came again: %s", res.State)
	}
	for p, end := range logEnds(t, s.Broker()) {
		if got := st.Acked["orders"][int32(p)]; got != end {
			t.Errorf("partition %d: saved offset %d after every held event came again, want the log end %d", p, got, end)
		}
	}
	shutdownAndCheck(t, s, dir, 35)
}

// savedState is the part of the sink's saved state the tests look at.
type savedState struct {
	Acked map[string]map[int32]int64 `json:"acked"`
	Held  []struct {
		Topic    string `json:"topic"`
		From, To int64
	} `json:"held"`
}

func decodeState(t *testing.T, raw []byte) savedState {
	t.Helper()
	var st savedState
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func TestSinkConformance(t *testing.T) {
	relaytest.RunSinkTests(t, func(t *testing.T) relaytest.SinkHarness {
		dir := t.TempDir()
		return relaytest.SinkHarness{
			New: func(t *testing.T) relay.Sink { return newSink(t, dir) },
			Read: func(t *testing.T, topic string) []relaytest.Record {
				var out []relaytest.Record
				for _, r := range e2e.ReadLog(t, dir, topic) {
					rec := relaytest.Record{Partition: r.Partition, Key: r.KeyBytes, Value: r.Value, Timestamp: r.Timestamp}
					for _, h := range r.HeaderList {
						rec.Headers = append(rec.Headers, relay.Header{Key: h.Key, Value: h.Value})
					}
					out = append(out, rec)
				}
				return out
			},
			Partitions:  3,
			ExactlyOnce: true,
		}
	})
}

// publishOK publishes msgs and fails the test on an error or a refusal.
func publishOK(t *testing.T, s *embedded.Sink, msgs []relay.Message) relay.PublishResult {
	t.Helper()
	res, err := s.Publish(context.Background(), msgs)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Failed) > 0 {
		t.Fatalf("refused: %v", res.Failed)
	}
	return res
}

func pick(all []relay.Message, idx ...int) []relay.Message {
	out := make([]relay.Message, 0, len(idx))
	for _, i := range idx {
		out = append(out, all[i])
	}
	return out
}

// TestRedeliveryInAnotherOrderAndSet: after a lost acknowledgement the
// source may deliver the unacknowledged events in another order, without
// some of them (rows an operator deleted), and mixed with new events (a
// WAL reader that re-read the table after losing its slot). The sink skips
// exactly the events the log holds, by event id, and appends every new one.
func TestRedeliveryInAnotherOrderAndSet(t *testing.T) {
	dir := t.TempDir()
	all := messages(0, 40)
	s := startedSink(t, dir, nil)
	saved := publishOK(t, s, all[:10]).State
	// Published, never acknowledged.
	publishOK(t, s, all[10:20])
	publishOK(t, s, all[20:30])
	s = restarted(t, s, dir, saved)
	// 12 and 13 vanished from the outbox; the rest come back reversed,
	// with new events in between.
	var again []int
	for i := 29; i >= 10; i-- {
		if i != 12 && i != 13 {
			again = append(again, i)
		}
		if i%5 == 0 {
			again = append(again, 30+(29-i)/5)
		}
	}
	publishOK(t, s, pick(all, again[:9]...))
	publishOK(t, s, pick(all, again[9:]...))
	publishOK(t, s, all[34:])
	shutdownAndCheck(t, s, dir, 40)
}

// TestReplayIsNotItsOriginal: a republished event carries its original
// event id and a relay-replay header; it is appended even while the
// original sits in the unacknowledged tail, and itself skipped when it is
// delivered again.
func TestReplayIsNotItsOriginal(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	orig := messages(0, 3)
	replayed := messages(0, 3)
	for i := range replayed {
		replayed[i].Headers = append(replayed[i].Headers, relay.Header{Key: relay.HeaderReplay, Value: []byte("7")})
		replayed[i].Value = fmt.Appendf(nil, "replay-%d", i)
	}
	s := startedSink(t, dir, nil)
	saved := publishOK(t, s, messages(100, 1)).State
	publishOK(t, s, orig)
	s.Close(ctx)

	for round := 0; round < 2; round++ {
		s = startedSink(t, dir, saved)
		publishOK(t, s, append(append([]relay.Message(nil), orig...), replayed...))
		s.Shutdown(ctx)
	}
	counts := readAll(t, dir)
	for i := 0; i < 3; i++ {
		if counts[fmt.Sprintf("event-%d", i)] != 1 || counts[fmt.Sprintf("replay-%d", i)] != 1 {
			t.Errorf("event %d: original %d times, replay %d times", i, counts[fmt.Sprintf("event-%d", i)], counts[fmt.Sprintf("replay-%d", i)])
		}
	}
}

// TestSequenceWrapPoints runs sink sessions whose sequences cross 2^30 and
// 2^31 (where Kafka's sequences wrap to 0) within one session, with a lost
// acknowledgement in the middle: nothing is skipped or doubled.
func TestSequenceWrapPoints(t *testing.T) {
	ctx := context.Background()
	for _, first := range []int32{1<<30 - 7, 1<<31 - 7} {
		t.Run(fmt.Sprint(first), func(t *testing.T) {
			dir := t.TempDir()
			cfg := sinkConfig(dir)
			cfg.Broker.DefaultPartitions = 1
			s := openSink(t, cfg)
			embedded.SetFirstSequence(s, first)
			start(t, s, nil)
			all := messages(0, 60)
			var saved []byte
			for i := 0; i < 40; i += 4 {
				res := publishOK(t, s, all[i:i+4])
				if i == 8 {
					saved = res.State // acknowledged through event 11
				}
			}
			s.Close(ctx)
			// A new session (sequences from 0 under a new epoch) gets
			// events 12..39 again, in other batches, then 40..59.
			s = openSink(t, cfg)
			start(t, s, saved)
			for i := 12; i < 60; i += 6 {
				publishOK(t, s, all[i:i+6])
			}
			shutdownAndCheck(t, s, dir, 60)
		})
	}
}

// TestClientsCannotProduceAsTheRelay: the broker refuses a Kafka client's
// batch under the relay's producer id, with the next sequence and with the
// next epoch alike, and the relay keeps publishing.
func TestClientsCannotProduceAsTheRelay(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := startedSink(t, dir, nil)
	defer s.Shutdown(ctx)
	publishOK(t, s, messages(0, 9))
	b := s.Broker()
	var relayID broker.ProducerID
	for p := int32(0); p < 3; p++ {
		for _, raw := range fetchBatches(t, b, "orders", p, 0) {
			h, _ := broker.ParseBatchHeader(raw)
			relayID = broker.ProducerID{ID: h.ProducerID, Epoch: h.ProducerEpoch}
		}
	}
	if !b.IsInternalProducer(relayID.ID) {
		t.Fatalf("producer %d is not reserved", relayID.ID)
	}
	for _, forged := range []broker.BatchOptions{
		{ProducerID: relayID.ID, ProducerEpoch: relayID.Epoch, BaseSequence: 3},
		{ProducerID: relayID.ID, ProducerEpoch: relayID.Epoch + 1, BaseSequence: 0},
	} {
		batch, err := broker.AppendBatch(nil, forged, []broker.Record{{Key: []byte("key-0"), Value: []byte("forged"),
			Headers: []broker.Header{{Key: relay.HeaderEventID, Value: []byte("id-9")}}}})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := b.ProduceAsync(ctx, "orders", 0, batch); !errors.Is(err, broker.ErrReservedProducerID) {
			t.Fatalf("a client's batch as the relay (%+v): %v", forged, err)
		}
	}
	publishOK(t, s, messages(9, 9))
	s.Shutdown(ctx)
	counts := readAll(t, dir)
	wantEachOnce(t, counts, 18)
	if counts["forged"] != 0 {
		t.Errorf("a forged record is in the log")
	}
}

// TestMissingTopicWaits: with WaitForTopics a batch naming a topic the
// broker lacks is refused whole with a relay.DestinationError naming it,
// nothing of it appended, and asked about again at every offer. The batch
// also re-delivers events of an unacknowledged session (step 3): the ones
// it matched while refused are still recognised when it is offered again
// after the topic exists, so every event is in the log once.
func TestMissingTopicWaits(t *testing.T) {
	ctx := context.Background()
	s, dir, saved := lostAcknowledgement(t, 5, 5)
	s.Close(ctx)

	cfg := sinkConfig(dir)
	cfg.WaitForTopics = true
	s = openSink(t, cfg)
	start(t, s, saved)
	defer s.Shutdown(ctx)
	batch := messages(5, 10) // 5..9 already in the log, 10..14 not
	for i := range 5 {
		m := batch[i+3]
		m.Topic = "payments"
		m.Value = fmt.Appendf(nil, "payment-%d", i)
		m.Headers = []relay.Header{{Key: relay.HeaderEventID, Value: fmt.Appendf(nil, "payment-id-%d", i)}}
		batch = append(batch, m)
	}
	for range 3 {
		_, err := s.Publish(ctx, batch)
		des := relay.DestinationErrors(err)
		if len(des) != 1 || des[0].Topic != "payments" || des[0].Reason != relay.WaitTopicMissing {
			t.Fatalf("Publish with a missing topic: %v (destination errors %v)", err, des)
		}
	}
	if err := s.Ready(ctx); err != nil {
		t.Fatalf("the sink reports a missing topic as its own failure: %v", err)
	}
	if _, err := s.Broker().CreateTopic("payments", broker.TopicConfig{Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	res, err := s.Publish(ctx, batch)
	if err != nil || len(res.Failed) > 0 {
		t.Fatalf("Publish once the topic exists: %v, failed %v", err, res.Failed)
	}
	shutdownAndCheck(t, s, dir, 15)
	if n := len(e2e.ReadLog(t, dir, "payments")); n != 5 {
		t.Errorf("payments holds %d records, want 5", n)
	}
}

// TestBrokerKeptOpenBetweenSessions: after Close the broker stays open
// (the Kafka listener keeps serving consumers) but takes no publish; the
// next Start reuses it; another process's Start (a second sink on the
// directory) makes the first give it up at once; Standby gives it up too.
func TestBrokerKeptOpenBetweenSessions(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := startedSink(t, dir, nil)
	publishOK(t, a, messages(0, 10))
	b := a.Broker()
	a.Close(ctx)
	if a.Broker() != b {
		t.Fatal("Close closed the broker")
	}
	if _, end, err := b.Offsets("orders", 0); err != nil || end == 0 {
		t.Fatalf("the broker kept open between sessions: end offset %d, %v", end, err)
	}
	if err := a.Ready(ctx); err == nil {
		t.Error("Ready between sessions: nil, want an error")
	}
	if _, err := a.Publish(ctx, messages(10, 1)); err == nil {
		t.Error("Publish between sessions succeeded")
	}
	start(t, a, nil)
	if a.Broker() != b {
		t.Fatal("the next session opened the broker again instead of reusing it")
	}
	publishOK(t, a, messages(0, 20))
	a.Close(ctx)

	other := newSink(t, dir)
	started := time.Now()
	start(t, other, nil)
	t.Logf("a second sink took the directory in %v", time.Since(started))
	if a.Broker() != nil {
		t.Fatal("the first sink still holds the broker after the second started")
	}
	publishOK(t, other, messages(20, 10))
	other.Close(ctx)
	other.Standby()
	if other.Broker() != nil {
		t.Fatal("Standby left the broker open")
	}
	wantEachOnce(t, readAll(t, dir), 30)
	if _, err := os.Stat(filepath.Join(dir, "TAKEOVER-REQUEST")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the takeover request is still in the directory: %v", err)
	}
}

// TestReusedBrokerSeesAbandonedAppends: a session ends with batches
// written but never waited for (the core abandons the waits of a failed
// session), so not yet fsynced and above the high watermark; the next
// session on the same open broker must still find them in the log and
// not append them again. (It did append them again before Start synced a
// reused broker: duplicates in cdc's TestE2EPostgresRestartMidStream.)
func TestReusedBrokerSeesAbandonedAppends(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := startedSink(t, dir, nil)
	all := messages(0, 30)
	publishOK(t, s, all[:10])
	if _, err := s.PublishAsync(ctx, all[10:20]); err != nil {
		t.Fatal(err)
	}
	s.Close(ctx)
	start(t, s, nil)
	publishOK(t, s, all[10:])
	shutdownAndCheck(t, s, dir, 30)
}

// TestDamagedUnacknowledgedRecords: a batch of the unacknowledged tail is
// damaged on disk (a flipped byte, which the broker reports lost when it
// reads it). Start still starts: the damaged records' identities cannot be
// read, so when their events come again they are appended again, which
// puts them back in the log; the other events of the tail are recognised
// and not appended twice.
func TestDamagedUnacknowledgedRecords(t *testing.T) {
	ctx := context.Background()
	s, dir, saved := lostAcknowledgement(t, 6, 12)
	// Stopped, so that the segments hold every batch (a running broker
	// holds its newest ones in memory for a while).
	s.Shutdown(ctx)

	// The last batch of partition 0 is the unacknowledged one: damage a
	// byte of its records.
	seg := filepath.Join(dir, "topics", "orders", "0", fmt.Sprintf("%020d.log", 0))
	data, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	last := -1
	for pos := 0; pos < len(data); {
		h, err := broker.ParseBatchHeader(data[pos:])
		if err != nil {
			t.Fatalf("batch at %d of %s: %v", pos, seg, err)
		}
		last = pos
		pos += h.Size()
	}
	if last <= 0 {
		t.Fatalf("partition 0 has %d bytes in one batch or none; want an acknowledged batch and one after it", len(data))
	}
	data[last+broker.BatchHeaderSize+2] ^= 0xff
	if err := os.WriteFile(seg, data, 0o644); err != nil {
		t.Fatal(err)
	}

	s = newSink(t, dir)
	if err := s.Start(ctx, relay.Session{State: saved}); err != nil {
		t.Fatalf("start over a damaged unacknowledged batch: %v", err)
	}
	publishOK(t, s, messages(6, 12))
	counts := map[string]int{}
	b := s.Broker()
	info, err := b.Topic("orders")
	if err != nil {
		t.Fatal(err)
	}
	lostParts := 0
	for _, pi := range info.Partitions {
		if len(pi.Lost) > 0 {
			lostParts++
		}
		for off := pi.LogStartOffset; off < pi.HighWatermark; {
			if r, ok := lostAt(pi.Lost, off); ok {
				off = r.Last + 1
				continue
			}
			for _, raw := range fetchBatches(t, b, "orders", pi.Partition, off) {
				_, recs, err := broker.DecodeBatch(raw)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range recs {
					if r.Offset >= off {
						counts[string(r.Value)]++
						off = r.Offset + 1
					}
				}
			}
		}
	}
	if lostParts != 1 {
		t.Fatalf("%d partitions report lost records, want 1", lostParts)
	}
	s.Shutdown(ctx)
	for i := range 18 {
		if got := counts[fmt.Sprintf("event-%d", i)]; got != 1 {
			t.Errorf("event-%d is readable %d times, want once", i, got)
		}
	}
}

func lostAt(lost []broker.LostRange, off int64) (broker.LostRange, bool) {
	for _, r := range lost {
		if off >= r.First && off <= r.Last {
			return r, true
		}
	}
	return broker.LostRange{}, false
}

// TestHeldEventsOfTruncatedRows: an operator deletes the outbox rows of
// published, unacknowledged events, so they never come again. Their
// records stay held, named in every saved state across sessions, and no
// other event is skipped; once retention (here DeleteRecords) removed the
// records, the next session's state names them no more.
func TestHeldEventsOfTruncatedRows(t *testing.T) {
	ctx := context.Background()
	s, dir, saved := lostAcknowledgement(t, 5, 5) // events 5-9 published; then their rows are deleted
	s = restarted(t, s, dir, saved)
	for round := range 3 {
		saved = publishOK(t, s, messages(10+5*round, 5)).State
		if st := decodeState(t, saved); len(st.Held) == 0 {
			t.Fatalf("round %d: the saved state names no held events while events 5-9 never came again: %s", round, saved)
		}
		s = restarted(t, s, dir, saved)
	}
	shutdownAndCheck(t, s, dir, 25)

	// Retention removes every record so far: the held runs go with them.
	s = startedSink(t, dir, saved)
	for p, end := range logEnds(t, s.Broker()) {
		if _, err := s.Broker().DeleteRecords("orders", int32(p), end); err != nil {
			t.Fatal(err)
		}
	}
	s = restarted(t, s, dir, saved)
	res := publishOK(t, s, messages(25, 5))
	if st := decodeState(t, res.State); len(st.Held) != 0 {
		t.Errorf("the saved state still names held events after retention removed their records: %s", res.State)
	}
	s.Shutdown(ctx)
}

// TestBatchSplitOverTopicLimit publishes one partition's 40 events of
// about 230 bytes, each within the topic's max.message.bytes (1,000) but
// not together, so one batch of them would be refused: the sink halves the
// batch until each part fits, reusing its record scratch for every part,
// and every event lands once, in order, with its headers.
func TestBatchSplitOverTopicLimit(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	cfg := sinkConfig(dir)
	cfg.Broker.DefaultPartitions = 1
	cfg.Broker.DefaultTopicConfig.MaxMessageBytes = 1000
	s := openSink(t, cfg)
	start(t, s, nil)
	msgs := messages(0, 40)
	for i := range msgs {
		msgs[i].Value = fmt.Appendf(nil, "event-%d-%s", i, strings.Repeat("x", 200))
	}
	publishOK(t, s, msgs)
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	records := e2e.ReadLog(t, dir, "orders")
	if len(records) != len(msgs) {
		t.Fatalf("%d records in the log, want %d", len(records), len(msgs))
	}
	for i, r := range records {
		if !bytes.Equal(r.Value, msgs[i].Value) || r.Headers[relay.HeaderEventID] != fmt.Sprintf("id-%d", i) {
			t.Fatalf("record %d is %q with headers %v, want event %d", i, r.Value, r.Headers, i)
		}
	}
}
