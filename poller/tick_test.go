package poller_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/poller"
	"github.com/outboxrelay/relay/relay"
)

// TestBatchOrderAndResume writes three concurrent transactions whose
// inserts interleave and which commit in the order C, A, B, so that the
// poller's first batch holds all three and is larger than a page. With
// track_commit_timestamp on, the batch comes in commit order (C's rows,
// then A's, then B's); off, in row-id order. Positions strictly increase.
// After acknowledging part of the batch and restarting from that position,
// the rest comes again in the same order.
func TestBatchOrderAndResume(t *testing.T) {
	eachMode(t, 2*time.Minute, func(t *testing.T, ctx context.Context, mode, url string, conn *pgx.Conn) {
		names := []string{"A", "B", "C"}
		txs := map[string]pgx.Tx{}
		for _, n := range names {
			tx, err := pgtest.Connect(t, url).Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			txs[n] = tx
		}
		var byID []string
		byTx := map[string][]string{}
		for i := 0; i < 900; i++ {
			n := names[i%3]
			payload := fmt.Sprintf("%s-%d", n, i/3)
			if _, err := txs[n].Exec(ctx, `INSERT INTO outbox.events (topic, key, payload) VALUES ('orders', $1, $2)`, n, []byte(payload)); err != nil {
				t.Fatal(err)
			}
			byID = append(byID, payload)
			byTx[n] = append(byTx[n], payload)
		}
		for _, n := range []string{"C", "A", "B"} {
			if err := txs[n].Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		want := byID
		if mode == "commit-timestamp" {
			want = slices.Concat(byTx["C"], byTx["A"], byTx["B"])
		}

		read := func(p *poller.Poller, from relay.Position, n int) []relay.Event {
			t.Helper()
			var got []relay.Event
			last := from
			for len(got) < n {
				events, err := p.Next(ctx, 200)
				if err != nil {
					t.Fatalf("Next after %d of %d events: %v", len(got), n, err)
				}
				for _, e := range events {
					if !last.Less(e.Position) {
						t.Fatalf("position %v after %v", e.Position, last)
					}
					last = e.Position
				}
				got = append(got, events...)
			}
			return got
		}
		check := func(got []relay.Event, want []string) {
			t.Helper()
			if len(got) != len(want) {
				t.Fatalf("got %d events, want %d", len(got), len(want))
			}
			for i, e := range got {
				if string(e.Payload) != want[i] {
					t.Fatalf("event %d = %s, want %s", i, e.Payload, want[i])
				}
			}
		}

		p := started(t, ctx, poller.Config{DatabaseURL: url, PollInterval: time.Minute}, relay.Position{})
		got := read(p, relay.Position{}, len(want))
		check(got, want)

		// Acknowledge the first 450 as the core does: delete the rows,
		// then Acked; restart from there.
		ids := make([]int64, 450)
		for i := range ids {
			ids[i] = got[i].ID
		}
		if _, err := conn.Exec(ctx, "SET relay.allow_outbox_changes = on"); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "DELETE FROM outbox.events WHERE id = ANY($1)", ids); err != nil {
			t.Fatal(err)
		}
		through := got[449].Position
		if err := p.Acked(ctx, through); err != nil {
			t.Fatal(err)
		}
		p.Close(ctx)
		p = started(t, ctx, poller.Config{DatabaseURL: url, PollInterval: time.Minute}, through)
		check(read(p, through, len(want)-450), want[450:])
	})
}
