package protocol

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
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

// consumeIsolated reads topic from the start until the partitions' ends (as
// ListOffsets reports them for the isolation level) and returns the values.
func consumeIsolated(t testing.TB, ctx context.Context, addr, topic string, committed bool) []string {
	t.Helper()
	iso := kgo.ReadUncommitted()
	if committed {
		iso = kgo.ReadCommitted()
	}
	cl := newKgo(t, addr, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(iso),
		kgo.FetchMaxWait(200*time.Millisecond))
	defer cl.Close()
	var out []string
	idle := 0
	for idle < 3 {
		pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		fs := cl.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil {
			t.Fatalf("consume %s: %v", topic, ctx.Err())
		}
		n := 0
		fs.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("fetch %s/%d: %v", topic, p, err)
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			out = append(out, string(r.Value))
			n++
		})
		if n == 0 {
			idle++
		} else {
			idle = 0
		}
	}
	return out
}

func TestTxnCommitAbortAndIsolationLevels(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx := testContext(t, 60*time.Second)
	const topic = "txn-iso"
	f.createTopic(t, topic, 3)
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
	_ = fmt.Sprint
	_ = kerr.ProducerFenced
}
