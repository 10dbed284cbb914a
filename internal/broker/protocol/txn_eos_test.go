package protocol

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The consume-transform-produce job of the crash tests (e2e.TxnJob): read
// eosSource, write each record's value prefixed with "b:" to eosSink,
// commit the source offsets in the same transaction (franz-go's
// GroupTransactSession).
const (
	eosSource = "eos-a"
	eosSink   = "eos-b"
	eosGroup  = "eos-group"
	eosTxnID  = "eos-etl"
	eosParts  = 3
)

// eosJob is the job against the broker at addr.
func eosJob(addr string, logf func(string, ...any)) e2e.TxnJob {
	return e2e.TxnJob{Addr: addr, Source: eosSource, Sink: eosSink, Group: eosGroup, TransactionalID: eosTxnID, Logf: logf}
}

// produceSource writes n records "a-<i>" to eosSource.
func produceSource(t testing.TB, ctx context.Context, addr string, n int) {
	t.Helper()
	cl := newKgo(t, addr, kgo.DefaultProduceTopic(eosSource))
	defer cl.Close()
	rs := make([]*kgo.Record, n)
	for i := range rs {
		rs[i] = &kgo.Record{Key: []byte("k-" + strconv.Itoa(i%50)), Value: []byte("a-" + strconv.Itoa(i))}
	}
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce source: %v", err)
	}
}

// checkExactlyOnce fails unless committed holds "b:a-<i>" exactly once for
// every i below n, and nothing else.
func checkExactlyOnce(t testing.TB, committed []string, n int) {
	t.Helper()
	seen := map[string]int{}
	for _, v := range committed {
		seen[v]++
	}
	var missing, dup []string
	for i := 0; i < n; i++ {
		v := "b:a-" + strconv.Itoa(i)
		switch seen[v] {
		case 1:
		case 0:
			missing = append(missing, v)
		default:
			dup = append(dup, fmt.Sprintf("%s×%d", v, seen[v]))
		}
		delete(seen, v)
	}
	if len(missing) > 0 || len(dup) > 0 || len(seen) > 0 {
		t.Fatalf("read_committed of %s: %d records, %d missing (%.10v), %d duplicated (%.10v), %d unexpected",
			eosSink, len(committed), len(missing), missing, len(dup), dup, len(seen))
	}
}

// endOffsets sums the high watermarks of topic's partitions.
func endOffsets(ctx context.Context, adm *kadm.Client, topic string) int64 {
	offs, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return -1
	}
	var sum int64
	offs.Each(func(o kadm.ListedOffset) {
		if o.Err == nil {
			sum += o.Offset
		}
	})
	return sum
}

// committedSum sums the group's committed offsets on eosSource.
func committedSum(ctx context.Context, adm *kadm.Client) int64 {
	offs, err := adm.FetchOffsets(ctx, eosGroup)
	if err != nil {
		return -1
	}
	var sum int64
	offs.Each(func(o kadm.OffsetResponse) {
		if o.Topic == eosSource && o.Err == nil {
			sum += o.At
		}
	})
	return sum
}

// waitGrowth waits (at most 20 s) until the sink's end moves past before.
func waitGrowth(t testing.TB, ctx context.Context, adm *kadm.Client, before int64) int64 {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if end := endOffsets(ctx, adm, eosSink); end > before {
			return end
		}
		time.Sleep(50 * time.Millisecond) // condition poll: the processor is another process
	}
	t.Fatalf("the processor wrote nothing to %s past offset sum %d in 20 s", eosSink, before)
	return 0
}

// waitUncommitted waits up to d until a partition of the sink holds
// records of an open transaction (its last stable offset is below its
// end).
func waitUncommitted(ctx context.Context, b *broker.Broker, d time.Duration) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		for part := range int32(eosParts) {
			lso, err1 := b.LastStableOffset(eosSink, part)
			_, end, err2 := b.Offsets(eosSink, part)
			if err1 == nil && err2 == nil && lso < end {
				return
			}
		}
		time.Sleep(2 * time.Millisecond) // condition poll
	}
}

// waitProcessed waits until the group committed all n source records.
func waitProcessed(t testing.TB, ctx context.Context, adm *kadm.Client, n int) {
	t.Helper()
	for committedSum(ctx, adm) != int64(n) {
		if ctx.Err() != nil {
			t.Fatalf("the group committed %d of %d source offsets: %v", committedSum(context.Background(), adm), n, ctx.Err())
		}
		time.Sleep(100 * time.Millisecond) // condition poll: committed offsets
	}
}

// TestTxnConsumeTransformProduceSurvivesProcessorKills: a
// GroupTransactSession processor, SIGKILLed five times while it works,
// each time restarted under the same transactional id; afterwards a
// read_committed reader of the sink sees every source record exactly once,
// and a read_uncommitted reader also sees the aborted records the killed
// processors had written.
func TestTxnConsumeTransformProduceSurvivesProcessorKills(t *testing.T) {
	t.Parallel()
	f := setupBroker(t, broker.Options{TxnCheckInterval: 200 * time.Millisecond}, nil)
	ctx := testContext(t, 3*time.Minute)
	f.createTopic(t, eosSource, eosParts)
	f.createTopic(t, eosSink, eosParts)
	const n = 2000
	produceSource(t, ctx, f.addr, n)
	adm := kadm.NewClient(newKgo(t, f.addr))
	defer adm.Close()

	env := []string{envTxnRole + "=processor", envTxnAddr + "=" + f.addr}
	end := int64(0)
	for kill := 0; kill < 5; kill++ {
		p := e2e.Start(t, os.Args[0], env)
		end = waitGrowth(t, ctx, adm, end)
		time.Sleep(time.Duration(50+rand.IntN(300)) * time.Millisecond) // deliberate pause: a random kill moment
		// Every other kill lands mid-transaction, with records written
		// and not committed: on a loaded machine the random moment alone
		// landed between transactions five times out of five, and the
		// test proved nothing. The others stay at the random moment.
		if kill%2 == 0 {
			waitUncommitted(ctx, f.b, 5*time.Second)
		}
		p.Kill()
		end = max(endOffsets(ctx, adm, eosSink), 0)
		if st, ok := f.b.Transaction(eosTxnID); ok {
			t.Logf("kill %d: transaction %s, sink end %d, group committed %d", kill+1, st.State, end, committedSum(ctx, adm))
		}
	}
	p := e2e.Start(t, os.Args[0], env)
	waitProcessed(t, ctx, adm, n)
	p.Kill()

	committed := consumeIsolated(t, ctx, f.addr, eosSink, true)
	checkExactlyOnce(t, committed, n)
	all := consumeIsolated(t, ctx, f.addr, eosSink, false)
	if len(all) <= len(committed) {
		t.Fatalf("read_uncommitted saw %d records, read_committed %d: no kill left an aborted transaction behind, the test proved nothing", len(all), len(committed))
	}
	t.Logf("%d records exactly once; %d aborted records visible to read_uncommitted only", len(committed), len(all)-len(committed))
}

// startBrokerProcess runs this test binary as a broker on dir at addr and
// waits until it answers.
func startBrokerProcess(t testing.TB, ctx context.Context, dir, addr string) *e2e.Proc {
	t.Helper()
	p := e2e.Start(t, os.Args[0], []string{envTxnRole + "=broker", envTxnAddr + "=" + addr, envTxnDir + "=" + dir})
	cl := newKgo(t, addr)
	defer cl.Close()
	for {
		if err := cl.Ping(ctx); err == nil {
			return p
		}
		if p.Exited() || ctx.Err() != nil {
			t.Fatalf("broker process did not come up: %s", p.Output())
		}
		time.Sleep(50 * time.Millisecond) // condition poll: the broker is another process
	}
}

// TestTxnConsumeTransformProduceSurvivesBrokerKills: the same job against
// a broker process SIGKILLed four times mid-transaction (data written,
// offsets pending, markers half written: wherever the kill lands) and
// restarted on its data directory; a read_committed reader of the sink
// sees every source record exactly once.
func TestTxnConsumeTransformProduceSurvivesBrokerKills(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 3*time.Minute)
	dir, addr := t.TempDir(), e2e.FreeAddr(t)
	b := startBrokerProcess(t, ctx, dir, addr)
	adm := kadm.NewClient(newKgo(t, addr))
	defer adm.Close()
	if _, err := adm.CreateTopics(ctx, eosParts, 1, nil, eosSource, eosSink); err != nil {
		t.Fatalf("create topics: %v", err)
	}
	const n = 2000
	produceSource(t, ctx, addr, n)

	pctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	var logs atomic.Int64
	go func() {
		done <- eosJob(addr, func(format string, args ...any) {
			if logs.Add(1) <= 50 {
				t.Logf("processor: "+format, args...)
			}
		}).Run(pctx)
	}()
	end := int64(0)
	for kill := 0; kill < 4; kill++ {
		end = waitGrowth(t, ctx, adm, end)
		time.Sleep(time.Duration(50+rand.IntN(300)) * time.Millisecond) // deliberate pause: a random kill moment
		b.Kill()
		b = startBrokerProcess(t, ctx, dir, addr)
		end = max(endOffsets(ctx, adm, eosSink), 0)
		if ds, err := adm.DescribeTransactions(ctx, eosTxnID); err == nil {
			d, _ := ds.On(eosTxnID, nil)
			t.Logf("kill %d: after the restart the transaction is %s (epoch %d, %d partitions), sink end %d",
				kill+1, d.State, d.ProducerEpoch, len(d.Topics), end)
		}
	}
	waitProcessed(t, ctx, adm, n)
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("processor: %v", err)
	}
	committed := consumeIsolated(t, ctx, addr, eosSink, true)
	checkExactlyOnce(t, committed, n)
	out := b.Output()
	if i := strings.Index(out, "panic"); i >= 0 {
		t.Fatalf("broker process panicked: %s", out[i:])
	}
}
