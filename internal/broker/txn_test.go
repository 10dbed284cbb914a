package broker

import (
	"context"
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// txnBatch builds a transactional batch of the producer with records k=v.
func txnBatch(t testing.TB, id ProducerID, seq int32, kv ...string) []byte {
	t.Helper()
	var rs []Record
	for i := 0; i+1 < len(kv); i += 2 {
		rs = append(rs, Record{Key: []byte(kv[i]), Value: []byte(kv[i+1])})
	}
	b, err := AppendBatch(nil, BatchOptions{ProducerID: id.ID, ProducerEpoch: id.Epoch, BaseSequence: seq, transactional: true}, rs)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustProduceTxn(t testing.TB, b *Broker, txnID, topic string, part int32, batch []byte) {
	t.Helper()
	_, wait, err := b.ProduceTxnAsync(context.Background(), txnID, topic, part, batch)
	if err == nil {
		err = wait()
	}
	if err != nil {
		t.Fatalf("transactional produce to %s/%d: %v", topic, part, err)
	}
}

// mustInitTxn gives transactional id x a new producer id, with timeout.
func mustInitTxn(t testing.TB, b *Broker, timeout time.Duration) ProducerID {
	t.Helper()
	id, err := b.InitTransactional(context.Background(), "x", timeout, ProducerID{ID: -1, Epoch: -1})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// mustAddTxnPartitions adds parts to x's transaction.
func mustAddTxnPartitions(t testing.TB, b *Broker, id ProducerID, parts []TxnPartition) {
	t.Helper()
	if err := b.AddTxnPartitions(context.Background(), "x", id, parts); err != nil {
		t.Fatal(err)
	}
}

// mustTxnOffsets adds group g to x's transaction and commits offsets in it.
func mustTxnOffsets(t testing.TB, b *Broker, id ProducerID, offsets ...OffsetCommit) {
	t.Helper()
	if err := b.AddTxnGroup(context.Background(), "x", id, "g"); err != nil {
		t.Fatal(err)
	}
	if err := b.TxnCommitOffsets(context.Background(), "x", id, "g", offsets); err != nil {
		t.Fatal(err)
	}
}

// mustEndTxn commits or aborts x's transaction.
func mustEndTxn(t testing.TB, b *Broker, id ProducerID, commit bool) {
	t.Helper()
	if err := b.EndTxn(context.Background(), "x", id, commit); err != nil {
		t.Fatal(err)
	}
}

// readCommitted reads a partition as a read_committed consumer does:
// control batches and the batches of aborted transactions are skipped. It
// returns key=value of each record.
func readCommitted(t testing.TB, b *Broker, topic string, part int32) []string {
	t.Helper()
	var out []string
	fetchFromStart(t, b, topic, part, true, func(off int64, res FetchResult) int64 {
		next := off
		for raw, err := range Batches(res.Batches) {
			if err != nil {
				t.Fatal(err)
			}
			h, recs, err := DecodeBatch(raw)
			if err != nil {
				t.Fatal(err)
			}
			next = h.LastOffset() + 1
			if h.Control() {
				continue
			}
			aborted := false
			for _, a := range res.Aborted {
				aborted = aborted || (h.Transactional() && a.ProducerID == h.ProducerID && a.FirstOffset <= h.BaseOffset && h.BaseOffset <= a.LastOffset)
			}
			if aborted {
				continue
			}
			for _, r := range recs {
				if r.Offset >= off {
					out = append(out, string(r.Key)+"="+string(r.Value))
				}
			}
		}
		return next
	})
	return out
}

func lso(t testing.TB, b *Broker, topic string, part int32) int64 {
	t.Helper()
	o, err := b.LastStableOffset(topic, part)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestTxnCoordinatorRecovery: an open transaction (partitions, data,
// pending offsets) survives a restart, with and without producer
// snapshots (the log replayed); it commits afterwards, the offsets become
// visible only then, and an aborted transaction's records stay hidden from
// read_committed across restarts.
func TestTxnCoordinatorRecovery(t *testing.T) {
	t.Parallel()
	for name, policy := range map[string]SyncPolicy{"fsync": SyncBeforeAck, "interval": SyncIntervalUnsafe} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testTxnCoordinatorRecovery(t, func(o *Options) { o.Sync = policy })
		})
	}
}

// reopenWithoutSnapshots closes b, removes the producer-state snapshots of
// t/0 and t/1 and opens the broker on dir again.
func reopenWithoutSnapshots(t *testing.T, b *Broker, dir string, mod func(*Options)) *Broker {
	t.Helper()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for p := int32(0); p < 2; p++ {
		removeSnapshots(t, partitionDir(dir, "t", p))
	}
	return openTest(t, dir, mod)
}

func testTxnCoordinatorRecovery(t *testing.T, mod func(*Options)) {
	dir := t.TempDir()
	ctx := context.Background()
	b := openWithTopic(t, dir, mod, "t", TopicConfig{Partitions: 2})
	mustAppend(t, b, "t", 0, EncodeBatch(-1, -1, -1, []Record{{Key: []byte("plain"), Value: []byte("0")}}))
	id := mustInitTxn(t, b, 10*time.Second)
	// An aborted transaction first.
	mustAddTxnPartitions(t, b, id, []TxnPartition{{"t", 0}})
	mustProduceTxn(t, b, "x", "t", 0, txnBatch(t, id, 0, "a", "aborted"))
	mustEndTxn(t, b, id, false)
	// Then one left open across restarts.
	mustAddTxnPartitions(t, b, id, []TxnPartition{{"t", 0}, {"t", 1}})
	mustProduceTxn(t, b, "x", "t", 0, txnBatch(t, id, 1, "b", "committed"))
	mustProduceTxn(t, b, "x", "t", 1, txnBatch(t, id, 0, "c", "committed"))
	mustTxnOffsets(t, b, id, OffsetCommit{Topic: "t", Partition: 0, Offset: 7})
	check := func(stage string, b *Broker) {
		t.Helper()
		if got := lso(t, b, "t", 0); got != 3 {
			t.Fatalf("%s: LSO of t/0 = %d, want 3 (the open transaction's first offset)", stage, got)
		}
		if got := lso(t, b, "t", 1); got != 0 {
			t.Fatalf("%s: LSO of t/1 = %d, want 0", stage, got)
		}
		if got := readCommitted(t, b, "t", 0); !equalStrings(got, []string{"plain=0"}) {
			t.Fatalf("%s: read_committed t/0 = %v", stage, got)
		}
		st, ok := b.Transaction("x")
		if !ok || st.State != TxnOngoing || len(st.Partitions) != 2 || len(st.Offsets) != 1 || st.Epoch != id.Epoch {
			t.Fatalf("%s: coordinator state %+v", stage, st)
		}
		if _, ok := b.FetchOffset("g", "t", 0); ok {
			t.Fatalf("%s: transactional offset visible before the commit", stage)
		}
		if !b.TxnOffsetsPending("g", "t", 0) {
			t.Fatalf("%s: offsets not pending", stage)
		}
	}
	check("before restart", b)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b = openTest(t, dir, mod)
	check("after a clean restart", b)
	b = reopenWithoutSnapshots(t, b, dir, mod)
	check("after a restart without snapshots", b)

	mustEndTxn(t, b, id, true)
	if err := b.EndTxn(ctx, "x", id, true); err != nil {
		t.Fatalf("a repeated EndTxn commit: %v", err)
	}
	verify := func(stage string, b *Broker) {
		t.Helper()
		for p := int32(0); p < 2; p++ {
			_, hw, _ := b.Offsets("t", p)
			if got := lso(t, b, "t", p); got != hw {
				t.Fatalf("%s: LSO of t/%d = %d, want the high watermark %d", stage, p, got, hw)
			}
		}
		if got := readCommitted(t, b, "t", 0); !equalStrings(got, []string{"plain=0", "b=committed"}) {
			t.Fatalf("%s: read_committed t/0 = %v", stage, got)
		}
		if got := readCommitted(t, b, "t", 1); !equalStrings(got, []string{"c=committed"}) {
			t.Fatalf("%s: read_committed t/1 = %v", stage, got)
		}
		if c, ok := b.FetchOffset("g", "t", 0); !ok || c.Offset != 7 {
			t.Fatalf("%s: committed offset %+v %v, want 7", stage, c, ok)
		}
		if st, _ := b.Transaction("x"); st.State != TxnCompleteCommit {
			t.Fatalf("%s: state %s", stage, st.State)
		}
	}
	verify("after the commit", b)
	b = reopenWithoutSnapshots(t, b, dir, mod)
	verify("after a restart without snapshots", b)
	next, err := b.InitTransactional(ctx, "x", 10*time.Second, id)
	if err != nil || next.ID != id.ID || next.Epoch != id.Epoch+1 {
		t.Fatalf("re-init: %+v %v, want epoch %d", next, err, id.Epoch+1)
	}
	if err := b.AddTxnPartitions(ctx, "x", id, []TxnPartition{{"t", 0}}); err == nil {
		t.Fatal("the old epoch added partitions after the re-init")
	}
}

// TestTxnCrashAfterDecision: the commit decision is durable but a crash
// came before all markers were written (here: one of two). On open the
// coordinator writes the markers again and stores the offsets; the second
// marker on the partition that had one changes nothing.
func TestTxnCrashAfterDecision(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := context.Background()
	b := openWithTopic(t, dir, nil, "t", TopicConfig{Partitions: 2})
	id := mustInitTxn(t, b, 10*time.Second)
	mustAddTxnPartitions(t, b, id, []TxnPartition{{"t", 0}, {"t", 1}})
	mustProduceTxn(t, b, "x", "t", 0, txnBatch(t, id, 0, "k0", "v0"))
	mustProduceTxn(t, b, "x", "t", 1, txnBatch(t, id, 0, "k1", "v1"))
	mustTxnOffsets(t, b, id, OffsetCommit{Topic: "t", Partition: 1, Offset: 42})
	// finishLocked's first two steps, then the "crash".
	c := b.txnCoordinator()
	e := c.entry("x", false)
	e.mu.Lock()
	st := e.st.clone()
	st.State = TxnPrepareCommit
	if err := c.persist(e, st); err != nil {
		t.Fatal(err)
	}
	wait, err := b.appendMarker(ctx, "t", 0, markerBatch(id.ID, id.Epoch, true, time.Now().UnixMilli()))
	if err != nil || wait() != nil {
		t.Fatalf("marker: %v", err)
	}
	e.mu.Unlock()
	if got := lso(t, b, "t", 1); got != 0 {
		t.Fatalf("LSO of t/1 without its marker = %d, want 0", got)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	b = openTest(t, dir, nil)
	for p := int32(0); p < 2; p++ {
		_, hw, _ := b.Offsets("t", p)
		if got := lso(t, b, "t", p); got != hw {
			t.Fatalf("after recovery LSO of t/%d = %d, want the high watermark %d", p, got, hw)
		}
	}
	if hw0, hw1 := hwOf(t, b, "t", 0), hwOf(t, b, "t", 1); hw0 != 3 || hw1 != 2 {
		t.Fatalf("high watermarks %d, %d: want a record and two markers on t/0, a record and one marker on t/1", hw0, hw1)
	}
	if got := readCommitted(t, b, "t", 0); !equalStrings(got, []string{"k0=v0"}) {
		t.Fatalf("read_committed t/0 = %v", got)
	}
	if got := readCommitted(t, b, "t", 1); !equalStrings(got, []string{"k1=v1"}) {
		t.Fatalf("read_committed t/1 = %v", got)
	}
	if c, ok := b.FetchOffset("g", "t", 1); !ok || c.Offset != 42 {
		t.Fatalf("offset after recovery %+v %v", c, ok)
	}
	if st, _ := b.Transaction("x"); st.State != TxnCompleteCommit {
		t.Fatalf("state after recovery %s", st.State)
	}
}

func hwOf(t testing.TB, b *Broker, topic string, part int32) int64 {
	t.Helper()
	_, hw, err := b.Offsets(topic, part)
	if err != nil {
		t.Fatal(err)
	}
	return hw
}

// TestTxnCompactionAndRetention: compaction cleans only below the LSO,
// keeps markers, and drops aborted records instead of letting them shadow
// the committed value of their key; retention keeps the segments of an
// open transaction until it ends.
func TestTxnCompactionAndRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := openTest(t, t.TempDir(), nil)
	mustCreate(t, b, "c", TopicConfig{CleanupPolicy: CleanupCompact, SegmentBytes: 1024})
	mustCreate(t, b, "d", TopicConfig{SegmentBytes: 1024, RetentionBytes: 1024, RetentionMs: -1})
	plain := func(topic, k, v string) {
		mustAppend(t, b, topic, 0, EncodeBatch(-1, -1, -1, []Record{{Key: []byte(k), Value: []byte(v)}}))
	}
	filler := func(topic string, n int) {
		for i := 0; i < n; i++ {
			plain(topic, "f"+string(rune('a'+i%26))+string(rune('a'+i/26)), string(make([]byte, 100)))
		}
	}
	plain("c", "a", "a1")
	plain("c", "b", "b1")
	id := mustInitTxn(t, b, time.Minute)
	mustAddTxnPartitions(t, b, id, []TxnPartition{{"c", 0}})
	mustProduceTxn(t, b, "x", "c", 0, txnBatch(t, id, 0, "a", "a-aborted"))
	mustEndTxn(t, b, id, false)
	filler("c", 20)
	mustAddTxnPartitions(t, b, id, []TxnPartition{{"c", 0}, {"d", 0}})
	mustProduceTxn(t, b, "x", "c", 0, txnBatch(t, id, 1, "b", "b-open"))
	mustProduceTxn(t, b, "x", "d", 0, txnBatch(t, id, 0, "d", "open"))
	filler("c", 20)
	filler("d", 40)

	if err := b.Compact(ctx); err != nil {
		t.Fatal(err)
	}
	got := readCommitted(t, b, "c", 0)
	want := map[string]bool{"a=a1": true, "b=b1": true}
	for _, kv := range got {
		delete(want, kv)
		if kv == "b=b-open" || kv == "a=a-aborted" {
			t.Fatalf("read_committed saw %s", kv)
		}
	}
	if len(want) > 0 {
		t.Fatalf("compaction lost %v (read_committed: %v)", want, got)
	}
	dStart, _, _ := b.Offsets("d", 0)
	if err := b.EnforceRetention(ctx); err != nil {
		t.Fatal(err)
	}
	if start, _, _ := b.Offsets("d", 0); start != dStart {
		t.Fatalf("retention moved the log start to %d past the open transaction at 0", start)
	}

	mustEndTxn(t, b, id, true)
	filler("c", 20)
	if err := b.Compact(ctx); err != nil {
		t.Fatal(err)
	}
	got = readCommitted(t, b, "c", 0)
	want = map[string]bool{"a=a1": true, "b=b-open": true}
	for _, kv := range got {
		delete(want, kv)
		if kv == "b=b1" {
			t.Fatalf("compaction kept b=b1 though the committed b=b-open is newer")
		}
	}
	if len(want) > 0 {
		t.Fatalf("after the commit compaction lost %v (read_committed: %v)", want, got)
	}
	if err := b.EnforceRetention(ctx); err != nil {
		t.Fatal(err)
	}
	if start, _, _ := b.Offsets("d", 0); start == 0 {
		t.Fatal("retention deleted nothing once the transaction ended")
	}
	// The abort marker of the first transaction is still in the log.
	markers := 0
	res, err := b.Fetch(ctx, "c", 0, 0, 1<<20)
	for off := int64(0); err == nil && len(res.Batches) > 0; res, err = b.Fetch(ctx, "c", 0, off, 1<<20) {
		for raw := range Batches(res.Batches) {
			h, _ := ParseBatchHeader(raw)
			off = h.LastOffset() + 1
			if h.Control() {
				markers++
			}
		}
	}
	if markers != 2 {
		t.Fatalf("%d markers in the compacted log, want the abort and the commit marker", markers)
	}
}

// TestTxnRefusals: transactional batches outside the coordinator's rules
// and timeouts out of range are refused.
func TestTxnRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := openWithTopic(t, t.TempDir(), nil, "t", TopicConfig{})
	if _, err := b.InitTransactional(ctx, "x", time.Hour, ProducerID{ID: -1, Epoch: -1}); err == nil {
		t.Fatal("a timeout above the maximum was accepted")
	}
	id := mustInitTxn(t, b, time.Second)
	if _, err := b.Append(ctx, "t", 0, txnBatch(t, id, 0, "k", "v")); err == nil {
		t.Fatal("Append took a transactional batch")
	}
	if _, _, err := b.ProduceTxnAsync(ctx, "x", "t", 0, txnBatch(t, id, 0, "k", "v")); err == nil {
		t.Fatal("a transactional batch for a partition not in the transaction was accepted")
	}
	if _, _, err := b.ProduceTxnAsync(ctx, "y", "t", 0, txnBatch(t, id, 0, "k", "v")); err == nil {
		t.Fatal("a batch under another transactional id's producer id was accepted")
	}
	if err := b.EndTxn(ctx, "x", id, true); err == nil {
		t.Fatal("EndTxn without a transaction succeeded")
	}
	if _, _, err := b.ProduceAsync(ctx, "t", 0, markerBatch(id.ID, id.Epoch, true, 0)); err == nil {
		t.Fatal("a client's control batch was accepted")
	}
	if err := b.AddTxnPartitions(ctx, "x", id, []TxnPartition{{"nope", 0}}); err == nil {
		t.Fatal("an unknown partition was added")
	}
	if _, err := os.Stat(filepath.Join(b.opts.Dir, "txns", txnStateFile)); err != nil {
		t.Fatal(err)
	}
}

// TestTxnTimeout: a transaction past its timeout is aborted with a bumped
// epoch, which fences its producer's writes and commit; that producer may
// still abort it and re-initialise with its old epoch (KIP-588), while a
// zombie fenced by a newer instance may not.
func TestTxnTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := &fakeClock{}
	clock.ms.Store(1_700_000_000_000)
	b := openWithTopic(t, t.TempDir(), func(o *Options) { o.Now = clock.now; o.TxnCheckInterval = time.Hour }, "t", TopicConfig{})
	id := mustInitTxn(t, b, time.Second)
	mustAddTxnPartitions(t, b, id, []TxnPartition{{"t", 0}})
	mustProduceTxn(t, b, "x", "t", 0, txnBatch(t, id, 0, "k", "v"))
	c := b.txnCoordinator()
	clock.ms.Add(900)
	c.expire(ctx)
	if st, _ := b.Transaction("x"); st.State != TxnOngoing {
		t.Fatalf("aborted before its timeout: %s", st.State)
	}
	clock.ms.Add(200)
	c.expire(ctx)
	st, _ := b.Transaction("x")
	if st.State != TxnCompleteAbort || st.Epoch != id.Epoch+1 {
		t.Fatalf("after the timeout: %s at epoch %d, want CompleteAbort at %d", st.State, st.Epoch, id.Epoch+1)
	}
	if got := lso(t, b, "t", 0); got != hwOf(t, b, "t", 0) {
		t.Fatalf("LSO %d after the abort", got)
	}
	if _, _, err := b.ProduceTxnAsync(ctx, "x", "t", 0, txnBatch(t, id, 1, "k", "late")); err == nil {
		t.Fatal("the timed-out producer wrote again")
	}
	if err := b.EndTxn(ctx, "x", id, true); err == nil {
		t.Fatal("the timed-out producer committed")
	}
	if err := b.EndTxn(ctx, "x", id, false); err != nil {
		t.Fatalf("the timed-out producer aborting: %v", err)
	}
	next, err := b.InitTransactional(ctx, "x", time.Second, id)
	if err != nil || next.Epoch != id.Epoch+2 {
		t.Fatalf("re-init with the timed-out epoch: %+v %v", next, err)
	}
	if _, err := b.InitTransactional(ctx, "x", time.Second, id); err == nil {
		t.Fatal("a re-init with a fenced epoch succeeded once a newer one exists")
	}
	if got := readCommitted(t, b, "t", 0); len(got) != 0 {
		t.Fatalf("read_committed %v", got)
	}
}

// TestTxnDump: relay log dump marks transactional records and prints the
// markers as markers.
func TestTxnDump(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	b := openWithTopic(t, dir, nil, "t", TopicConfig{})
	id := mustInitTxn(t, b, time.Second)
	for _, commit := range []bool{true, false} {
		mustAddTxnPartitions(t, b, id, []TxnPartition{{"t", 0}})
		seq := int32(0)
		if !commit {
			seq = 1
		}
		mustProduceTxn(t, b, "x", "t", 0, txnBatch(t, id, seq, "k", "v"))
		mustEndTxn(t, b, id, commit)
	}
	writeOut(b)
	var text, js strings.Builder
	if err := Dump(ctx, &text, DumpOptions{DataDir: dir, Partition: -1}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(text.String()), "\n")
	if len(lines) != 4 || !strings.HasSuffix(lines[0], "transactional=true") ||
		!strings.Contains(lines[1], "control=commit producer_id=") || !strings.Contains(lines[3], "control=abort") {
		t.Fatalf("text dump:\n%s", text.String())
	}
	if err := Dump(ctx, &js, DumpOptions{DataDir: dir, Partition: -1, Format: "json"}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(js.String(), `"control":"commit"`) || !strings.Contains(js.String(), `"transactional":true`) {
		t.Fatalf("json dump: %s", js.String())
	}
}

// TestSnapshotVersions: a version 2 snapshot round-trips the open and
// aborted transactions; a version 1 snapshot (written before transactions
// existed) still loads, with none; truncated or altered bytes are refused.
func TestSnapshotVersions(t *testing.T) {
	t.Parallel()
	table := producerTable{
		7: {epoch: 2, batches: []ProducerBatch{{FirstSeq: 0, LastSeq: 4, FirstOffset: 10, LastOffset: 14, MaxTimestamp: 99}}},
		9: {epoch: 0},
	}
	x := newTxnIndex()
	x.open[7] = 10
	x.aborted = []AbortedTxn{{ProducerID: 9, FirstOffset: 3, LastOffset: 6}}
	b := encodeSnapshot(20, table, x)
	off, gotTable, gotX, err := decodeSnapshot(b)
	if err != nil || off != 20 || len(gotTable) != 2 || gotTable[7].batches[0] != table[7].batches[0] {
		t.Fatalf("decode: %d %v %v", off, gotTable, err)
	}
	if len(gotX.open) != 1 || gotX.open[7] != 10 || len(gotX.aborted) != 1 || gotX.aborted[0] != x.aborted[0] {
		t.Fatalf("transactions decoded as %+v, want %+v", gotX, x)
	}
	for n := 0; n < len(b); n++ {
		if _, _, _, err := decodeSnapshot(b[:n]); err == nil {
			t.Fatalf("a snapshot cut to %d of %d bytes decoded", n, len(b))
		}
	}

	// Version 1: the same producers, no transaction part.
	v1 := append([]byte(nil), snapshotMagic...)
	v1 = binary.BigEndian.AppendUint16(v1, 1)
	v1 = binary.BigEndian.AppendUint64(v1, 20)
	v1 = binary.BigEndian.AppendUint32(v1, 1)
	v1 = binary.BigEndian.AppendUint64(v1, 7)
	v1 = binary.BigEndian.AppendUint16(v1, 2)
	v1 = append(v1, 0)
	v1 = binary.BigEndian.AppendUint32(v1, crc32.Checksum(v1, castagnoli))
	off, gotTable, gotX, err = decodeSnapshot(v1)
	if err != nil || off != 20 || gotTable[7] == nil || gotTable[7].epoch != 2 || len(gotX.open) != 0 || len(gotX.aborted) != 0 {
		t.Fatalf("version 1 snapshot: %d %v %+v %v", off, gotTable, gotX, err)
	}
}
