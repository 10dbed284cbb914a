package poller_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/migrations"
	"github.com/outboxrelay/relay/poller"
	"github.com/outboxrelay/relay/relay"
)

// modeDatabase returns a migrated database, and a connection to it, in
// the cluster of mode: "row-id" (track_commit_timestamp off) or
// "commit-timestamp" (on).
func modeDatabase(t *testing.T, mode string) (string, *pgx.Conn) {
	t.Helper()
	var url string
	if mode == "row-id" {
		url = pgtest.NewDatabase(t)
	} else {
		url = pgtest.CommitTimestampDatabase(t)
	}
	conn := pgtest.Connect(t, url)
	pgtest.Migrate(t, conn, migrations.DefaultSchema)
	return url, conn
}

// eachMode runs test as a subtest in each mode of modeDatabase, on a
// database of that mode, with a context that ends after timeout.
func eachMode(t *testing.T, timeout time.Duration, test func(t *testing.T, ctx context.Context, mode, url string, conn *pgx.Conn)) {
	for _, mode := range []string{"row-id", "commit-timestamp"} {
		t.Run(mode, func(t *testing.T) {
			url, conn := modeDatabase(t, mode)
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			test(t, ctx, mode, url, conn)
		})
	}
}

// started returns a poller of cfg started from from; the test's end
// closes it.
func started(t *testing.T, ctx context.Context, cfg poller.Config, from relay.Position) *poller.Poller {
	t.Helper()
	p, err := poller.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(context.Background()) })
	if err := p.Start(ctx, from); err != nil {
		t.Fatal(err)
	}
	return p
}
