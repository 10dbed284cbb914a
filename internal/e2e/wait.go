package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/testbin"
)

// Migrated returns a fresh database with Relay's schema, migrated by the
// real binary, and the binary's path. The package must run under
// pgtest.Run.
func Migrated(t testing.TB) (url, bin string) {
	t.Helper()
	url = pgtest.NewDatabase(t)
	return url, MigrateURL(t, url)
}

// HoldAcks locks the checkpoint table for d and then runs then: the relay
// keeps publishing into its sink but cannot record it, so a kill in then
// lands between the sink's acknowledgement and Postgres's.
func HoldAcks(t testing.TB, ctx context.Context, conn *pgx.Conn, d time.Duration, then func()) {
	t.Helper()
	holdAcks(t, ctx, conn, d, nil, then)
}

// holdAcks is HoldAcks calling locked, when set, once the lock is held.
func holdAcks(t testing.TB, ctx context.Context, conn *pgx.Conn, d time.Duration, locked, then func()) {
	t.Helper()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "LOCK TABLE outbox.checkpoints IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	if locked != nil {
		locked()
	}
	time.Sleep(d)
	then()
}

// Published is how many events the checkpoints count as published.
func Published(ctx context.Context, conn *pgx.Conn) (int64, error) {
	var n int64
	err := conn.QueryRow(ctx, "SELECT coalesce(sum(published), 0)::bigint FROM outbox.checkpoints").Scan(&n)
	return n, err
}

// WaitPublished waits until the checkpoints count at least n events.
func WaitPublished(t testing.TB, url string, n int64, timeout time.Duration) {
	t.Helper()
	conn := pgtest.Connect(t, url)
	deadline := time.Now().Add(timeout)
	for {
		got, err := Published(context.Background(), conn)
		if err != nil {
			t.Fatal(err)
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d events published after %v, want at least %d", got, timeout, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitRole waits until /readyz names role.
func WaitRole(t testing.TB, p *Proc, role string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	got := ""
	for time.Now().Before(deadline) {
		if got = p.Role(); got == role {
			return
		}
		if p.Exited() {
			t.Fatalf("relay exited while waiting for role %s:\n%s", role, p.Output())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("role is %q after %v, want %s", got, timeout, role)
}

// WaitReady waits until /readyz says ready (or, with ready false, not
// ready).
func WaitReady(t testing.TB, p *Proc, ready bool, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, role := p.Ready()
		if ok == ready {
			return
		}
		if p.Exited() {
			t.Fatalf("relay exited while waiting for ready=%v:\n%s", ready, p.Output())
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz: ready=%v (role %q) after %v, want ready=%v", ok, role, timeout, ready)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// scrape GETs the relay's /metrics at addr; the caller closes the body.
func scrape(t testing.TB, addr string) *http.Response {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scraping metrics: %v", err)
	}
	return resp
}

// Metric reads one unlabelled metric from the relay's /metrics at addr.
func Metric(t testing.TB, addr, name string) float64 {
	t.Helper()
	for _, line := range MetricLines(t, addr) {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("metric %s not exported", name)
	return 0
}

// MetricLines scrapes the relay's /metrics at addr.
func MetricLines(t testing.TB, addr string) []string {
	t.Helper()
	resp := scrape(t, addr)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("scraping metrics: %v", err)
	}
	return strings.Split(string(body), "\n")
}

// MigrateURL migrates the database at url (of any cluster) with the real
// binary and returns the binary's path.
func MigrateURL(t testing.TB, url string) (bin string) {
	t.Helper()
	bin = testbin.Relay(t)
	p := Start(t, bin, nil, "migrate", "up", "--database-url", url)
	if code := p.Wait(time.Minute); code != 0 {
		t.Fatalf("migrate up: exit %d: %s", code, p.Output())
	}
	return bin
}
