package poller_test

import (
	"bytes"
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
)

// TestLargeEventsWithinMemoryLimit runs the relay binary with the default
// limits (1 MiB messages, 8 MiB batches) under GOMEMLIMIT=224MiB while
// four writers commit 10,000 small events, two others 1,000 events of
// 0.95 MB each, and five rows above the message limit arrive among them:
// 50 MiB for the poll reader, which never loads them; 2 MiB for the WAL
// reader, which receives every row whole from pgoutput (see docs/operating.md,
// "Memory"). The relay's peak RSS stays within 256 MiB, it never restarts
// its pipeline and never dies, the five rows are in the dead letters with
// their whole payload, and the log holds every other committed event
// exactly once in per-key order.
func TestLargeEventsWithinMemoryLimit(t *testing.T) {
	for _, c := range []struct {
		source    string
		hugeBytes int
	}{{"poll", 50 << 20}, {"cdc", 2 << 20}} {
		t.Run(c.source, func(t *testing.T) { testLargeEvents(t, c.source, c.hugeBytes) })
	}
}

func testLargeEvents(t *testing.T, source string, hugeBytes int) {
	url, bin := e2e.Migrated(t)
	dataDir := e2e.DataDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const memLimit = 256 << 20
	// e2e writers pad a payload of PayloadBytes with PayloadBytes-60 x's.
	const padBytes = 950_000 - 60
	p := e2e.Start(t, bin, []string{"GOMEMLIMIT=224MiB"}, runArgs(url, dataDir, e2e.FreeAddr(t), "--source", source)...)
	e2e.WaitRole(t, p, "leader", 30*time.Second)

	var died atomic.Bool
	watching, stopWatching := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for watching.Err() == nil {
			if p.Exited() {
				died.Store(true)
				return
			}
			time.Sleep(50 * time.Millisecond) // condition poll: watches the relay process for an exit
		}
	}()

	small, large := e2e.NewLedger(), e2e.NewLedger()
	var g errgroup.Group
	g.Go(func() error {
		return e2e.Write(ctx, e2e.WriterConfig{URL: url, Schema: "outbox", Topic: "small", Writers: 4, Events: 10_000,
			Keys: 200, PerTx: 5, RollbackEvery: 10, PayloadBytes: 100}, small)
	})
	g.Go(func() error {
		return e2e.Write(ctx, e2e.WriterConfig{URL: url, Schema: "outbox", Topic: "large", Writers: 2, Events: 1_000,
			Keys: 20, PerTx: 3, RollbackEvery: 10, PayloadBytes: 950_000}, large)
	})
	var huge []string
	hugeConn := pgtest.Connect(t, url)
	g.Go(func() error {
		for i := range 5 {
			for large.Len() < 150*(i+1) {
				time.Sleep(10 * time.Millisecond) // condition poll: waits for the ledger to grow
			}
			var id string
			if err := hugeConn.QueryRow(ctx, `INSERT INTO outbox.events (topic, key, payload, headers)
VALUES ('large', 'huge', convert_to(repeat('x', $1), 'UTF8'), '{"test":"e2e"}') RETURNING event_id::text`, hugeBytes).Scan(&id); err != nil {
				return err
			}
			huge = append(huge, id)
		}
		return nil
	})
	started := time.Now()
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	t.Logf("written in %v", time.Since(started))
	e2e.WaitDrained(t, url, "outbox", 2*time.Minute)
	t.Logf("drained %v after the start of the writes", time.Since(started))
	stopWatching()
	<-watched
	if died.Load() {
		t.Fatalf("the relay died:\n%s", p.Output())
	}
	peak, err := p.PeakRSS()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("relay peak RSS %.1f MiB", float64(peak)/(1<<20))
	if peak > memLimit {
		t.Errorf("the relay's peak RSS was %.1f MiB, the limit is %d MiB", float64(peak)/(1<<20), memLimit>>20)
	}

	conn := pgtest.Connect(t, url)
	rows, err := conn.Query(ctx, `SELECT event_id::text, reason, octet_length(payload), error FROM outbox.dead_letters ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var dead []string
	for rows.Next() {
		var id, reason, msg string
		var size int64
		if err := rows.Scan(&id, &reason, &size, &msg); err != nil {
			t.Fatal(err)
		}
		if reason != "too_large" || size != int64(hugeBytes) {
			t.Errorf("dead letter %s: reason %s, %d bytes of payload (%s); want too_large with its %d bytes", id, reason, size, msg, hugeBytes)
		}
		dead = append(dead, id)
	}
	if strings.Join(dead, ",") != strings.Join(huge, ",") {
		t.Errorf("dead letters %v, want the five huge rows %v", dead, huge)
	}

	p.Stop(30 * time.Second)
	out := p.Output()
	if n := strings.Count(out, "pipeline started"); n != 1 || strings.Contains(out, "restarting") || strings.Contains(out, "stopped leading") {
		var errs []string
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, "level=ERROR") || strings.Contains(line, "restarting") {
				errs = append(errs, line)
			}
		}
		t.Fatalf("the relay's pipeline started %d times or restarted:\n%s", n, strings.Join(errs, "\n"))
	}
	t.Logf("stopped %v after the start of the writes", time.Since(started))
	e2e.Check(t, e2e.ReadLog(t, dataDir, "small"), small)
	// The large events are checked without their padding, which is
	// checked for its length: the log is read one batch at a time.
	var records []e2e.Record
	e2e.EachRecord(t, dataDir, "large", func(r e2e.Record) {
		pad := bytes.Index(r.Value, []byte(`,"pad":"`))
		if pad < 0 || len(r.Value)-pad != len(`,"pad":"`)+padBytes+len(`"}`) ||
			bytes.Count(r.Value[pad:], []byte{'x'}) != padBytes {
			t.Fatalf("record large/%d@%d: %d bytes, not a 0.95 MB test event", r.Partition, r.Offset, len(r.Value))
		}
		r.Value = append(r.Value[:pad:pad], '}')
		records = append(records, r)
	})
	e2e.Check(t, records, large)
	t.Logf("checked %v after the start of the writes", time.Since(started))
}
