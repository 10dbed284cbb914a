package upgrade_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/migrations"
)

// TestNewerSchemaWithinRange: `relay run` on a schema one migration ahead
// of it starts, warns and publishes when that migration's recorded
// compatibility bound is this relay's latest version (as the next
// release's expand migrations record), and exits with one line when the
// bound is beyond it.
func TestNewerSchemaWithinRange(t *testing.T) {
	m, err := migrations.New(migrations.DefaultSchema)
	if err != nil {
		t.Fatal(err)
	}
	latest := m.Latest()
	for _, tc := range []struct {
		name  string
		bound int
	}{{"compatible", latest}, {"beyond", latest + 1}} {
		t.Run(tc.name, func(t *testing.T) {
			url, bin := e2e.Migrated(t)
			admin := pgtest.Connect(t, url)
			ctx := context.Background()
			if _, err := admin.Exec(ctx, "INSERT INTO outbox.schema_migrations (version, name, compatible_from) VALUES ($1, 'from_the_next_release', $2)",
				latest+1, tc.bound); err != nil {
				t.Fatal(err)
			}
			p := e2e.Start(t, bin, nil, "run", "--database-url", url, "--data-dir", e2e.DataDir(t), "--http-addr", e2e.FreeAddr(t),
				"--kafka-addr", "", "--source", "poll", "--poll-interval", "100ms")
			if tc.bound > latest {
				code := p.Wait(time.Minute)
				if code <= 0 || !strings.Contains(p.Output(), "migrated by a newer relay") || strings.Contains(p.Output(), "goroutine ") {
					t.Fatalf("relay run on a schema beyond its range: exit %d, want a one-line refusal; output:\n%s", code, p.Output())
				}
				return
			}
			e2e.WaitRole(t, p, "leader", time.Minute)
			if !strings.Contains(p.Output(), "the schema was migrated by a newer relay whose migrations keep this one compatible") {
				t.Errorf("no warning about the newer schema in:\n%s", p.Output())
			}
			ledger := e2e.NewLedger()
			cfg := e2e.WriterConfig{URL: url, Schema: "outbox", Topic: "orders", Writers: 2, Events: 200, Keys: 20, PerTx: 5, PayloadBytes: 50}
			if err := e2e.Write(ctx, cfg, ledger); err != nil {
				t.Fatal(err)
			}
			e2e.WaitDrained(t, url, "outbox", time.Minute)
			p.Stop(time.Minute)
		})
	}
}
