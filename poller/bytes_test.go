package poller_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/poller"
	"github.com/outboxrelay/relay/relay"
)

// TestPagesBoundedByBytes writes, in two transactions (so that the first
// page comes from the fresh read and the rest from the page reads; in
// commit-timestamp mode also from the id list of a large batch), rows of
// 900 bytes, rows above the 1,000-byte message limit and small rows, and
// reads them with a 3,000-byte page budget and a row limit the pages never
// reach. Every row comes once in order; no page holds more than 3,000 bytes
// of loaded rows unless it holds one; the rows above the limit come
// without key, payload and headers, with their size.
func TestPagesBoundedByBytes(t *testing.T) {
	eachMode(t, time.Minute, func(t *testing.T, ctx context.Context, mode, url string, conn *pgx.Conn) {
		const limit, page = 1000, 3000
		sizes := []int{900, 900, 5000, 900, 20, 20, 900, 900, 900, 3000, 900, 20, 2500, 900, 900}
		// Headers count as their JSON text: {"h": "v"} is 10 bytes.
		const headers, headersText = `{"h":"v"}`, 10
		for half := range 2 {
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range sizes {
				if _, err := tx.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload, headers) VALUES ('t', 'k', $1, $2)`,
					bytes.Repeat([]byte{'a' + byte(half)}, n-1-headersText), headers); err != nil {
					t.Fatal(err)
				}
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		want := append(append([]int{}, sizes...), sizes...)

		p := started(t, ctx, poller.Config{DatabaseURL: url, MaxMessageBytes: limit, PageBytes: page, PollInterval: 50 * time.Millisecond}, relay.Position{})
		var got []relay.Event
		for len(got) < len(want) {
			events, err := p.Next(ctx, 100)
			if err != nil {
				t.Fatalf("Next after %d of %d events: %v", len(got), len(want), err)
			}
			loaded, n := 0, 0
			for _, e := range events {
				if e.TooLarge == 0 {
					loaded += len(e.Key) + len(e.Payload) + headersText
					n++
				}
			}
			if loaded > page && n > 1 {
				t.Errorf("a page of %d events holds %d bytes of %d loaded rows, the budget is %d", len(events), loaded, n, page)
			}
			got = append(got, events...)
		}
		if len(got) != len(want) {
			t.Fatalf("got %d events, want %d", len(got), len(want))
		}
		for i, e := range got {
			if i > 0 && e.ID <= got[i-1].ID {
				t.Errorf("event %d: row %d after row %d", i, e.ID, got[i-1].ID)
			}
			size := want[i]
			if size > limit {
				if e.TooLarge != int64(size) || e.Payload != nil || string(e.Key) != "k" || e.Headers != nil {
					t.Errorf("event %d of %d bytes: TooLarge %d, %d bytes of payload, key %q, headers %q; want its size, its key and no other content",
						i, size, e.TooLarge, len(e.Payload), e.Key, e.Headers)
				}
				continue
			}
			if e.TooLarge != 0 || len(e.Key)+len(e.Payload)+headersText != size || string(e.Headers) != `{"h": "v"}` {
				t.Errorf("event %d of %d bytes: TooLarge %d, key %q, %d bytes of payload, headers %q", i, size, e.TooLarge, e.Key, len(e.Payload), e.Headers)
			}
		}
	})
}
