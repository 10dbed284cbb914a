package protocol

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/testwait"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// txnProduce runs one transaction of n records to topic and ends it.
func txnProduce(t testing.TB, ctx context.Context, cl *kgo.Client, topic, prefix string, n int, commit bool) {
	t.Helper()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatalf("begin: %v", err)
	}
	rs := make([]*kgo.Record, n)
	for i := range rs {
		rs[i] = &kgo.Record{Topic: topic, Key: []byte(prefix + strconv.Itoa(i%7)), Value: []byte(prefix + strconv.Itoa(i))}
	}
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
		t.Fatalf("end transaction (commit %v): %v", commit, err)
	}
}

// consumeIsolated reads topic from the start, as a read_committed or a
// read_uncommitted consumer, until three polls in a row bring nothing
// (e2e.ReadIsolated), and returns the values.
func consumeIsolated(t testing.TB, ctx context.Context, addr, topic string, committed bool) []string {
	t.Helper()
	out, err := e2e.ReadIsolated(ctx, addr, topic, committed)
	if err != nil {
		t.Fatalf("consume %s: %v", topic, err)
	}
	return out
}

func TestTxnCommitAbortAndIsolationLevels(t *testing.T) {
	t.Parallel()
	const topic = "txn-iso"
	f, ctx := setupTopic(t, topic, 3, 60*time.Second)
	cl := newKgo(t, f.addr, kgo.TransactionalID("iso-1"), kgo.DefaultProduceTopic(topic))
	defer cl.Close()
	txnProduce(t, ctx, cl, topic, "c1-", 30, true)
	txnProduce(t, ctx, cl, topic, "a1-", 20, false)
	txnProduce(t, ctx, cl, topic, "c2-", 30, true)

	committed := consumeIsolated(t, ctx, f.addr, topic, true)
	all := consumeIsolated(t, ctx, f.addr, topic, false)
	if len(committed) != 60 {
		t.Fatalf("read_committed saw %d records, want the 60 committed: %v", len(committed), committed)
	}
	for _, v := range committed {
		if v[0] != 'c' {
			t.Fatalf("read_committed saw aborted record %q", v)
		}
	}
	if len(all) != 80 {
		t.Fatalf("read_uncommitted saw %d records, want all 80", len(all))
	}
	st, ok := f.b.Transaction("iso-1")
	if !ok || st.State != broker.TxnCompleteCommit {
		t.Fatalf("coordinator state %+v, %v", st, ok)
	}
}

// TestTxnZombieIsFenced: a second producer with the same transactional id
// fences the first; the first (the zombie) can then neither write nor
// commit, and its open transaction is aborted: read_committed never sees
// it, read_uncommitted does, and the zombie's later record is nowhere.
func TestTxnZombieIsFenced(t *testing.T) {
	t.Parallel()
	const topic = "txn-zombie"
	f, ctx := setupTopic(t, topic, 1, 60*time.Second)
	zombie := newKgo(t, f.addr, kgo.TransactionalID("z"), kgo.DefaultProduceTopic(topic), kgo.RecordRetries(2))
	defer zombie.Close()
	if err := zombie.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if err := zombie.ProduceSync(ctx, &kgo.Record{Value: []byte("old-" + strconv.Itoa(i))}).FirstErr(); err != nil {
			t.Fatalf("zombie produce before the fence: %v", err)
		}
	}
	newer := newKgo(t, f.addr, kgo.TransactionalID("z"), kgo.DefaultProduceTopic(topic))
	defer newer.Close()
	txnProduce(t, ctx, newer, topic, "new-", 3, true)

	err := zombie.ProduceSync(ctx, &kgo.Record{Value: []byte("zombie")}).FirstErr()
	if !errors.Is(err, kerr.InvalidProducerEpoch) && !errors.Is(err, kerr.ProducerFenced) {
		t.Fatalf("zombie produce after the fence: %v, want INVALID_PRODUCER_EPOCH or PRODUCER_FENCED", err)
	}
	if err := zombie.EndTransaction(ctx, kgo.TryCommit); err == nil {
		t.Fatal("the fenced zombie committed its transaction")
	}

	// A raw transactional batch under the old epoch is refused too.
	st, _ := f.b.Transaction("z")
	batch, err := broker.AppendBatch(nil, broker.BatchOptions{ProducerID: st.ProducerID, ProducerEpoch: st.Epoch - 1, BaseSequence: 5}, []broker.Record{{Value: []byte("raw-zombie")}})
	if err != nil {
		t.Fatal(err)
	}
	batch[22] |= 0x10 // transactional attribute
	fixCRC(batch)
	if _, _, err := f.b.ProduceTxnAsync(ctx, "z", topic, 0, batch); !errors.Is(err, broker.ErrInvalidProducerEpoch) {
		t.Fatalf("raw produce under the fenced epoch: %v", err)
	}

	committed := consumeIsolated(t, ctx, f.addr, topic, true)
	if strings.Join(committed, ",") != "new-0,new-1,new-2" {
		t.Fatalf("read_committed saw %v, want only the newer producer's records", committed)
	}
	all := consumeIsolated(t, ctx, f.addr, topic, false)
	if got := strings.Join(all, ","); got != "old-0,old-1,old-2,old-3,old-4,new-0,new-1,new-2" {
		t.Fatalf("read_uncommitted saw %v, want the zombie's aborted records and the newer ones, and no later zombie record", all)
	}
}

// TestTxnTimeoutAbortsAbandonedTransaction: a transaction left open past
// transaction.timeout.ms is aborted by the coordinator with a bumped
// epoch; its producer can no longer commit it; DescribeTransactions and
// ListTransactions report it.
func TestTxnTimeoutAbortsAbandonedTransaction(t *testing.T) {
	t.Parallel()
	f := setupBroker(t, broker.Options{TxnCheckInterval: 50 * time.Millisecond}, nil)
	ctx := testContext(t, 60*time.Second)
	const topic = "txn-timeout"
	f.createTopic(t, topic, 2)
	cl := newKgo(t, f.addr, kgo.TransactionalID("slow"), kgo.TransactionTimeout(2*time.Second), kgo.DefaultProduceTopic(topic))
	defer cl.Close()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte{byte(i)}, Value: []byte("slow-" + strconv.Itoa(i))}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	adm := kadm.NewClient(newKgo(t, f.addr))
	defer adm.Close()
	ds, err := adm.DescribeTransactions(ctx, "slow")
	if err != nil {
		t.Fatal(err)
	}
	d, _ := ds.On("slow", nil)
	if d.State != "Ongoing" || d.TimeoutMillis != 2000 || len(d.Topics[topic]) == 0 {
		t.Fatalf("described %+v, want Ongoing with timeout 2000 and partitions of %s", d, topic)
	}
	epoch := d.ProducerEpoch
	testwait.Until(t, 30*time.Second, "the coordinator to abort the timed-out transaction", func() error {
		st, _ := f.b.Transaction("slow")
		if st.State != broker.TxnCompleteAbort {
			return fmt.Errorf("transaction still %s", st.State)
		}
		if st.Epoch != epoch+1 {
			t.Fatalf("timed-out transaction aborted at epoch %d, want the bumped %d", st.Epoch, epoch+1)
		}
		return nil
	})
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err == nil {
		t.Fatal("committed a transaction the coordinator aborted")
	}
	if got := consumeIsolated(t, ctx, f.addr, topic, true); len(got) != 0 {
		t.Fatalf("read_committed saw %v of the aborted transaction", got)
	}
	if got := consumeIsolated(t, ctx, f.addr, topic, false); len(got) != 4 {
		t.Fatalf("read_uncommitted saw %v, want the 4 aborted records", got)
	}
	ls, err := adm.ListTransactions(ctx, nil, []string{"CompleteAbort"})
	if err != nil {
		t.Fatal(err)
	}
	if l, ok := ls["slow"]; !ok || l.State != "CompleteAbort" {
		t.Fatalf("ListTransactions(CompleteAbort) = %v", ls)
	}
	if ls, _ := adm.ListTransactions(ctx, nil, []string{"Ongoing"}); len(ls) != 0 {
		t.Fatalf("ListTransactions(Ongoing) = %v, want none", ls)
	}
}

// TestTxnLastStableOffsetAndUnstableOffsets: while a transaction is open,
// ListOffsets and Fetch under read_committed stop at its first offset, and
// an OffsetFetch with require_stable of a group whose offsets it holds
// answers UNSTABLE_OFFSET_COMMIT; after the commit both move on.
func TestTxnLastStableOffsetAndUnstableOffsets(t *testing.T) {
	t.Parallel()
	const topic = "txn-lso"
	f, ctx := setupTopic(t, topic, 1, 60*time.Second)
	plain := newKgo(t, f.addr, kgo.DefaultProduceTopic(topic))
	defer plain.Close()
	produceKeyed(t, ctx, plain, topic, 3)
	cl := newKgo(t, f.addr, kgo.TransactionalID("lso"), kgo.DefaultProduceTopic(topic))
	defer cl.Close()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("open")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	produceKeyed(t, ctx, plain, topic, 2) // after the open transaction's record
	adm := kadm.NewClient(newKgo(t, f.addr))
	defer adm.Close()
	pid, epoch, err := cl.ProducerID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	add := kmsg.NewPtrAddOffsetsToTxnRequest()
	add.TransactionalID, add.ProducerID, add.ProducerEpoch, add.Group = "lso", pid, epoch, "lso-group"
	if resp, err := add.RequestWith(ctx, cl); err != nil || resp.ErrorCode != 0 {
		t.Fatalf("AddOffsetsToTxn: %v %v", resp, err)
	}
	commit := kmsg.NewPtrTxnOffsetCommitRequest()
	commit.TransactionalID, commit.Group, commit.ProducerID, commit.ProducerEpoch, commit.Generation = "lso", "lso-group", pid, epoch, -1
	ct := kmsg.NewTxnOffsetCommitRequestTopic()
	ct.Topic = topic
	cp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
	cp.Partition, cp.Offset = 0, 2
	ct.Partitions = append(ct.Partitions, cp)
	commit.Topics = append(commit.Topics, ct)
	if resp, err := commit.RequestWith(ctx, cl); err != nil || resp.Topics[0].Partitions[0].ErrorCode != 0 {
		t.Fatalf("TxnOffsetCommit: %v %v", resp, err)
	}

	latest := func(committed bool) int64 {
		t.Helper()
		req := kmsg.NewPtrListOffsetsRequest()
		if committed {
			req.IsolationLevel = 1
		}
		req.Topics = append(req.Topics, latestOffsetTopic(topic))
		resp, err := req.RequestWith(ctx, plain)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Topics[0].Partitions[0].Offset
	}
	stableFetch := func() int16 {
		t.Helper()
		req := kmsg.NewPtrOffsetFetchRequest()
		req.Version, req.Group, req.RequireStable = 7, "lso-group", true
		rt := kmsg.NewOffsetFetchRequestTopic()
		rt.Topic, rt.Partitions = topic, []int32{0}
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, plain)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Topics[0].Partitions[0].ErrorCode
	}
	if got := latest(true); got != 3 {
		t.Fatalf("read_committed latest offset %d while the transaction at 3 is open, want 3", got)
	}
	if got := latest(false); got != 6 {
		t.Fatalf("read_uncommitted latest offset %d, want 6", got)
	}
	if code := stableFetch(); code != kerr.UnstableOffsetCommit.Code {
		t.Fatalf("OffsetFetch require_stable with offsets pending: code %d, want UNSTABLE_OFFSET_COMMIT", code)
	}
	if _, ok := f.b.FetchOffset("lso-group", topic, 0); ok {
		t.Fatal("transactional offset visible before the commit")
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	if got := latest(true); got != 7 {
		t.Fatalf("read_committed latest offset %d after the commit marker, want 7", got)
	}
	if code := stableFetch(); code != 0 {
		t.Fatalf("OffsetFetch require_stable after the commit: code %d", code)
	}
	if c, ok := f.b.FetchOffset("lso-group", topic, 0); !ok || c.Offset != 2 {
		t.Fatalf("committed offset %+v %v after the commit, want 2", c, ok)
	}
	if got := consumeIsolated(t, ctx, f.addr, topic, true); len(got) != 6 {
		t.Fatalf("read_committed saw %v, want 6 records", got)
	}
}

// fixCRC recomputes a batch's CRC after its attributes were changed.
func fixCRC(b []byte) {
	binary.BigEndian.PutUint32(b[17:], crc32.Checksum(b[21:], crc32.MakeTable(crc32.Castagnoli)))
}

// TestTxnLibrdkafka: a second client family, librdkafka through Debian's
// python3-confluent-kafka, commits and aborts transactions and runs a
// consume-transform-produce transaction with send_offsets_to_transaction
// against the broker (testdata/txn_client.py).
func TestTxnLibrdkafka(t *testing.T) {
	t.Parallel()
	python := pythonWith(t, "confluent_kafka")
	f := setup(t, nil)
	f.createTopic(t, "py-in", 1)
	f.createTopic(t, "py-out", 1)
	cmd := exec.Command(python, "testdata/txn_client.py", f.addr, "py-in", "py-out")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("txn_client.py: %v\n%s", err, stderr.String())
	}
	var got struct {
		Committed, Uncommitted, Out []string
		Moved                       int
		GroupOffset                 int64 `json:"group_offset"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("txn_client.py output %q: %v", out, err)
	}
	var wantCommitted, wantOut []string
	for i := 0; i < 10; i++ {
		wantCommitted = append(wantCommitted, "py-commit-"+strconv.Itoa(i))
		wantOut = append(wantOut, "out:py-commit-"+strconv.Itoa(i))
	}
	if strings.Join(got.Committed, ",") != strings.Join(wantCommitted, ",") {
		t.Errorf("read_committed saw %v, want %v", got.Committed, wantCommitted)
	}
	if len(got.Uncommitted) != 15 {
		t.Errorf("read_uncommitted saw %d records (%v), want the 10 committed and the 5 aborted", len(got.Uncommitted), got.Uncommitted)
	}
	if got.Moved != 10 || strings.Join(got.Out, ",") != strings.Join(wantOut, ",") {
		t.Errorf("consume-transform-produce output %v, want %v", got.Out, wantOut)
	}
	// 10 records, a commit marker, 5 aborted records, an abort marker.
	if got.GroupOffset != 17 {
		t.Errorf("py-group committed offset %d, want 17 (past both markers)", got.GroupOffset)
	}
	if c, ok := f.b.FetchOffset("py-group", "py-in", 0); !ok || c.Offset != got.GroupOffset {
		t.Errorf("broker's committed offset %+v %v", c, ok)
	}
}
