package relay

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/outboxrelay/relay/internal/pgtest"
)

// syncBuffer is a log destination safe for the service's goroutine and
// the test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// value reads a gauge's or a counter's value.
func value(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	if d.Gauge != nil {
		return d.Gauge.GetValue()
	}
	return d.Counter.GetValue()
}

// TestMaintenanceErrorsSurface: the backlog sampler sets its gauge; when
// its query is blocked (the outbox locked) each pass ends at its deadline
// and is counted as a timeout, the log says so once however many passes
// fail, and the gauge's last good pass stays visible; once the lock goes,
// a pass succeeds again, the log says it recovered, and Stop returns
// with the service's goroutine gone.
func TestMaintenanceErrorsSurface(t *testing.T) {
	ctx := context.Background()
	url, conn := pgtest.MigratedDatabase(t, "outbox")
	var logs syncBuffer
	r, err := New(Config{DatabaseURL: url, BacklogInterval: 20 * time.Millisecond, Lease: time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.pool, err = r.connectPool(ctx); err != nil {
		t.Fatal(err)
	}
	defer r.pool.Close()
	svc := r.svc.backlog
	svc.TestSignals = &maintenanceSignals{}
	svc.TestSignals.Init()
	waitPass := func(want func(error) bool, what string) error {
		t.Helper()
		timeout := time.After(time.Minute)
		for {
			select {
			case err := <-svc.TestSignals.Pass:
				if want(err) {
					return err
				}
			case <-timeout:
				t.Fatalf("no %s pass of the backlog service within a minute", what)
			}
		}
	}
	if _, err := conn.Exec(ctx, `INSERT INTO outbox.events (topic) VALUES ('t'), ('t'), ('t')`); err != nil {
		t.Fatal(err)
	}
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := svc.Start(ctx); err == nil {
		t.Fatal("a running service started again")
	}
	waitPass(func(err error) bool { return err == nil }, "good")
	if got := value(t, r.m.Backlog); got != 3 {
		t.Fatalf("backlog gauge %v; want 3", got)
	}
	good := value(t, r.m.MaintenanceOK.WithLabelValues("backlog"))
	if time.Since(time.Unix(int64(good), 0)) > time.Minute {
		t.Fatalf("last good pass at %v", good)
	}

	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE outbox.events IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := waitPass(func(err error) bool { return err != nil }, "failed"); errorKind(err) != "timeout" {
			t.Fatalf("a pass blocked by a lock failed with %v (%s); want a timeout", err, errorKind(err))
		}
	}
	if n := value(t, r.m.MaintenanceErrors.WithLabelValues("backlog", "timeout")); n < 2 {
		t.Fatalf("relay_maintenance_errors_total{backlog, timeout} = %v after two failed passes", n)
	}
	if n := strings.Count(logs.String(), "maintenance service failing"); n != 1 {
		t.Fatalf("%d warnings for two failures of one kind; want 1:\n%s", n, logs.String())
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waitPass(func(err error) bool { return err == nil }, "good")
	if !strings.Contains(logs.String(), `msg="maintenance service recovered" service=backlog failed_with=timeout`) {
		t.Fatalf("no recovery in the log:\n%s", logs.String())
	}
	svc.Stop()
	svc.Stop() // a second Stop does nothing
}
