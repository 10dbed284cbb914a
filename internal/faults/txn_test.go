package faults_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/internal/e2e"
)

// TestRelayKilledDuringConsumeTransformProduce: a stream processor built
// on the relay's log (e2e.TxnJob, franz-go's GroupTransactSession) reads
// the relay's topic and writes its results to another topic of the
// embedded broker, committing its offsets in each transaction, while the
// relay publishes more events and is SIGKILLed three times
// mid-transaction. A read_committed reader of the output sees every
// record of the relay's topic exactly once, and the relay's own log still
// has every committed event exactly once.
func TestRelayKilledDuringConsumeTransformProduce(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const source, sink = "orders", "etl-out"
	kafkaAddr := e2e.FreeAddr(t)
	r := e.newNode("relay", "--kafka-addr", kafkaAddr, "--partitions", "3", "--listener-writable-topics", sink).start()
	e2e.WaitReady(t, r.proc, true, 30*time.Second)
	ledger := e2e.NewLedger()
	if err := e2e.Write(ctx, e.writers(1000), ledger); err != nil {
		t.Fatal(err)
	}
	e2e.WaitDrained(t, e.url, "outbox", time.Minute)

	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkaAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopics(ctx, 3, 1, nil, sink); err != nil {
		t.Fatal(err)
	}
	sum := func(topic string) int64 {
		offs, err := adm.ListEndOffsets(ctx, topic)
		if err != nil {
			return -1
		}
		var n int64
		offs.Each(func(o kadm.ListedOffset) { n += o.Offset })
		return n
	}
	committed := func() int64 {
		n, err := committedOffsets(ctx, cl, "etl", source)
		if err != nil {
			return -1
		}
		return n
	}

	jctx, stopJob := context.WithCancel(ctx)
	jobDone := make(chan error, 1)
	var logs atomic.Int64
	logf := func(format string, args ...any) {
		if logs.Add(1) <= 30 {
			t.Logf("processor: "+format, args...)
		}
	}
	go func() {
		jobDone <- e2e.TxnJob{Addr: kafkaAddr, Source: source, Sink: sink, Group: "etl", TransactionalID: "etl",
			SessionTimeout: 6 * time.Second, MaxRecords: 100, Logf: logf}.Run(jctx)
	}()
	writing := e2e.WriteAsync(ctx, e.writers(1000), ledger)
	start := time.Now()
	for kill := 0; kill < 3; kill++ {
		before := max(sum(sink), 0)
		deadline := time.Now().Add(30 * time.Second)
		for sum(sink) <= before {
			if ctx.Err() != nil || time.Now().After(deadline) {
				t.Fatalf("the processor wrote nothing past %d", before)
			}
			time.Sleep(50 * time.Millisecond) // condition poll: the processor is another process
		}
		time.Sleep(time.Duration(50+rand.IntN(300)) * time.Millisecond) // deliberate pause: a random kill moment
		r.proc.Kill()
		r.start()
		e2e.WaitReady(t, r.proc, true, 30*time.Second)
		t.Logf("kill %d at %v: output end %d", kill+1, time.Since(start).Round(time.Millisecond), sum(sink))
	}
	if err := <-writing; err != nil {
		t.Fatal(err)
	}
	e2e.WaitDrained(t, e.url, "outbox", time.Minute)
	for want := sum(source); committed() != want; want = sum(source) {
		if ctx.Err() != nil {
			t.Fatalf("the processor committed %d of the %d source offsets", committed(), want)
		}
		time.Sleep(100 * time.Millisecond) // condition poll: committed offsets
	}
	t.Logf("all processed at %v", time.Since(start).Round(time.Millisecond))
	stopJob()
	if err := <-jobDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("job: %v", err)
	}

	input, err := e2e.ReadIsolated(ctx, kafkaAddr, source, false)
	if err != nil {
		t.Fatal(err)
	}
	output, err := e2e.ReadIsolated(ctx, kafkaAddr, sink, true)
	if err != nil {
		t.Fatal(err)
	}
	if diff := e2e.CheckTransformed(input, output); diff != "" {
		t.Fatalf("read_committed output of the processor: %s", diff)
	}
	all, err := e2e.ReadIsolated(ctx, kafkaAddr, sink, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d source records transformed exactly once; %d aborted output records visible to read_uncommitted only", len(input), len(all)-len(output))
	r.stop()
	e2e.CheckLog(t, e.dataDir, ledger)
}
