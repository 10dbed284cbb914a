package cdc_test

import (
	"context"
	"math"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/testbin"
	"github.com/outboxrelay/relay/migrations"
)

// benchEvents is the backlog size of BenchmarkDrainVsRecvlogical
// (CDC_BENCH_EVENTS, default 1,000,000).
func benchEvents() int {
	if v, err := strconv.Atoi(os.Getenv("CDC_BENCH_EVENTS")); err == nil && v > 0 {
		return v
	}
	return 1_000_000
}

// benchEnv is a migrated database for the real binary, with the relay's
// slot and publication created and the outbox empty.
type benchEnv struct {
	url, bin, dataDir, addr, slot string
	conn                          *pgx.Conn
}

func newBenchEnv(b *testing.B) *benchEnv {
	b.Helper()
	url, conn := pgtest.MigratedDatabase(b, migrations.DefaultSchema)
	ctx := context.Background()
	e := &benchEnv{url: url, bin: testbin.Relay(b), dataDir: e2e.DataDir(b), addr: e2e.FreeAddr(b),
		slot: "slot_" + conn.Config().Database, conn: conn}
	// A first run creates the slot and the publication on the empty
	// outbox; it stops once the slot's table read is recorded done.
	p := e.start(b)
	deadline := time.Now().Add(time.Minute)
	for {
		var done bool
		conn.QueryRow(ctx, "SELECT consistent_lsn IS NOT NULL AND snapshot IS NULL FROM outbox.cdc_slots WHERE slot_name = $1", e.slot).Scan(&done)
		if done {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("the relay did not create its slot:\n%s", p.Output())
		}
		time.Sleep(20 * time.Millisecond) // condition poll: the slot is created by another process
	}
	p.Stop(time.Minute)
	return e
}

func (e *benchEnv) start(b *testing.B, extra ...string) *e2e.Proc {
	args := []string{"run", "--source", "cdc", "--database-url", e.url, "--data-dir", e.dataDir, "--http-addr", e.addr,
		"--slot", e.slot, "--kafka-addr", "", "--fsync", "always", "--log-level", "warn"}
	return e2e.Start(b, e.bin, nil, append(args, extra...)...)
}

func (e *benchEnv) published(b *testing.B) int64 {
	n, err := e2e.Published(context.Background(), e.conn)
	if err != nil {
		b.Fatal(err)
	}
	return n
}

func (e *benchEnv) walLSN(b *testing.B) string {
	var lsn string
	if err := e.conn.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		b.Fatal(err)
	}
	return lsn
}

// BenchmarkDrainVsRecvlogical drains a backlog of 1,000,000 outbox events
// (200-byte payloads, 1,000-event transactions) with the real binary
// (--source cdc, embedded log, fsync before every acknowledgement) and,
// in the same run, decodes the same WAL range with pg_recvlogical and
// pgoutput into /dev/null from a second slot created at the same point.
// It reports both rates and their ratio. Run it alone:
//
//	go test -run '^$' -bench BenchmarkDrainVsRecvlogical -benchtime 1x ./cdc/
func BenchmarkDrainVsRecvlogical(b *testing.B) {
	recv, err := exec.LookPath("pg_recvlogical")
	if err != nil {
		b.Fatalf("pg_recvlogical is needed for the comparison: %v", err)
	}
	n := benchEvents()
	e := newBenchEnv(b)
	ctx := context.Background()
	recvSlot := "recv_" + e.conn.Config().Database
	if _, err := e.conn.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", recvSlot); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		e.conn.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", recvSlot)
	})

	wroteStart := time.Now()
	for done := 0; done < n; done += 1000 {
		if _, err := e.conn.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload)
SELECT 'bench', 'key-' || (g % 1000), convert_to(repeat('x', 200), 'UTF8') FROM generate_series(1, $1::int) AS g`, min(1000, n-done)); err != nil {
			b.Fatal(err)
		}
	}
	end := e.walLSN(b)
	b.Logf("wrote %d events in %d transactions in %v; WAL end %s", n, (n+999)/1000, time.Since(wroteStart).Round(time.Millisecond), end)
	b.ResetTimer()

	for i := 0; i < b.N; i++ {
		if i > 0 {
			b.Log("the backlog is drained after the first iteration; use -benchtime 1x")
			break
		}
		// pg_recvlogical: pgoutput, protocol 1, the relay's publication,
		// to /dev/null, stopping at the WAL end of the backlog.
		began := time.Now()
		cmd := exec.Command(recv, "-d", e.url, "--slot", recvSlot, "--start", "--no-loop",
			"-o", "proto_version=1", "-o", "publication_names=relay_outbox", "-f", "/dev/null", "--endpos", end)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("pg_recvlogical: %v\n%s", err, out)
		}
		recvTook := time.Since(began)

		// The relay: from process start until the checkpoint counts all.
		began = time.Now()
		p := e.start(b)
		var first time.Time
		var firstN int64
		for {
			got := e.published(b)
			if got > 0 && first.IsZero() {
				first, firstN = time.Now(), got
			}
			if got >= int64(n) {
				break
			}
			if p.Exited() {
				b.Fatalf("relay exited:\n%s", p.Output())
			}
			time.Sleep(5 * time.Millisecond) // condition poll: the relay is another process
		}
		relayTook := time.Since(began)
		steady := float64(int64(n)-firstN) / time.Since(first).Seconds()
		p.Stop(time.Minute)

		recvRate := float64(n) / recvTook.Seconds()
		relayRate := float64(n) / relayTook.Seconds()
		b.ReportMetric(relayRate, "relay-events/s")
		b.ReportMetric(recvRate, "recvlogical-events/s")
		b.ReportMetric(relayRate/recvRate*100, "%-of-recvlogical")
		b.Logf("pg_recvlogical: %d events in %v = %.0f events/s", n, recvTook.Round(time.Millisecond), recvRate)
		b.Logf("relay (process start to last acknowledgement): %d events in %v = %.0f events/s (%.0f%% of pg_recvlogical); after the first acknowledgement %.0f events/s",
			n, relayTook.Round(time.Millisecond), relayRate, relayRate/recvRate*100, steady)
	}
}

// BenchmarkLiveLatency writes 10,000 events/s (4 writers, 25-event
// transactions every 10 ms each) for 20 seconds while the real binary
// streams them, and reports commit-to-durable-acknowledgement latency:
// from the relay's relay_publish_latency_seconds histogram (created_at, the
// writing transaction's start, to the log's fsync) and from probes (a
// one-event transaction committed, then the time until the relay deleted
// its row, which it does in the acknowledgement that follows the fsync).
//
//	go test -run '^$' -bench BenchmarkLiveLatency -benchtime 1x ./cdc/
func BenchmarkLiveLatency(b *testing.B) {
	e := newBenchEnv(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := e.start(b)
	defer p.Stop(time.Minute)
	const (
		writers  = 4
		perTx    = 25
		interval = 10 * time.Millisecond
		runFor   = 20 * time.Second
	)
	b.ResetTimer()
	var wg sync.WaitGroup
	var mu sync.Mutex
	written := 0
	stopAt := time.Now().Add(runFor)
	for w := 0; w < writers; w++ {
		goWithConn(ctx, b, &wg, e.url, func(conn *pgx.Conn) {
			t := time.NewTicker(interval)
			defer t.Stop()
			for time.Now().Before(stopAt) {
				<-t.C
				if _, err := conn.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload)
SELECT 'bench', 'key-' || (g % 1000), convert_to(repeat('x', 200), 'UTF8') FROM generate_series(1, $1::int) AS g`, perTx); err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				written += perTx
				mu.Unlock()
			}
		})
	}
	// Probes, one at a time: commit, then wait for the row to go. A row
	// still there after 3 s is counted as stuck (see the report of
	// published rows left behind) and the next probe starts.
	var probes []time.Duration
	stuck := 0
	goWithConn(ctx, b, &wg, e.url, func(conn *pgx.Conn) {
		time.Sleep(2 * time.Second) // benchmark pacing: past the start
		for time.Now().Before(stopAt) {
			var id int64
			if err := conn.QueryRow(ctx, `INSERT INTO outbox.events (topic, key, payload) VALUES ('probe', 'p', '\x00') RETURNING id`).Scan(&id); err != nil {
				b.Error(err)
				return
			}
			committed := time.Now()
			for time.Since(committed) < 3*time.Second {
				var left bool
				if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM outbox.events WHERE id = $1)", id).Scan(&left); err != nil {
					b.Error(err)
					return
				}
				if !left {
					probes = append(probes, time.Since(committed))
					break
				}
				time.Sleep(200 * time.Microsecond) // condition poll (benchmark probe)
			}
			if time.Since(committed) >= 3*time.Second {
				stuck++
			}
			time.Sleep(5 * time.Millisecond) // benchmark pacing: between probes
		}
	})
	wg.Wait()
	took := runFor
	// Wait until the checkpoint counts every written event, then count
	// the rows left in the outbox: published rows whose DELETE in the
	// acknowledgement did not see them (see the package's known issues).
	deadline := time.Now().Add(time.Minute)
	for e.published(b) < int64(written+len(probes)+stuck) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond) // condition poll (benchmark)
	}
	b.StopTimer()
	var left int
	if err := e.conn.QueryRow(context.Background(), "SELECT count(*) FROM outbox.events").Scan(&left); err != nil {
		b.Fatal(err)
	}

	h50, count := e2e.LatencyQuantile(b, e.addr, 0.5)
	h99, _ := e2e.LatencyQuantile(b, e.addr, 0.99)
	sort.Slice(probes, func(i, j int) bool { return probes[i] < probes[j] })
	q := func(f float64) time.Duration {
		if len(probes) == 0 {
			return 0
		}
		return probes[min(len(probes)-1, int(math.Ceil(f*float64(len(probes))))-1)]
	}
	rate := float64(written) / took.Seconds()
	b.ReportMetric(rate, "events/s")
	b.ReportMetric(float64(h50.Microseconds())/1000, "hist-p50-ms")
	b.ReportMetric(float64(h99.Microseconds())/1000, "hist-p99-ms")
	b.ReportMetric(float64(q(0.5).Microseconds())/1000, "probe-p50-ms")
	b.ReportMetric(float64(q(0.99).Microseconds())/1000, "probe-p99-ms")
	b.ReportMetric(float64(left), "rows-left")
	b.Logf("%.0f events/s for %v: relay_publish_latency_seconds (created_at to fsync) over %d events p50 %v p99 %v; probes (commit to row deleted by the acknowledgement) n=%d p50 %v p99 %v max %v, %d probe rows never deleted; %d published rows left in the outbox",
		rate, took, count, h50, h99, len(probes), q(0.5), q(0.99), q(1), stuck, left)
}

// goWithConn runs fn in a goroutine of wg with a connection of its own to
// url, closed when fn returns; a failure to connect is reported with
// b.Error (which a goroutine may call) and fn does not run.
func goWithConn(ctx context.Context, b *testing.B, wg *sync.WaitGroup, url string, fn func(*pgx.Conn)) {
	wg.Go(func() {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			b.Error(err)
			return
		}
		defer conn.Close(context.Background())
		fn(conn)
	})
}
