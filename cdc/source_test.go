package cdc_test

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/cdc"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/relay"
)

// TestStreamsEventFields reads every field of two inserts, with values in
// binary format (the default from PostgreSQL 14) and in text format, the
// latter from a session whose time zone is 5:30 east of UTC.
func TestStreamsEventFields(t *testing.T) {
	t.Parallel()
	for _, text := range []bool{false, true} {
		t.Run(fmt.Sprintf("text=%v", text), func(t *testing.T) {
			t.Parallel()
			streamsEventFields(t, text)
		})
	}
}

func streamsEventFields(t *testing.T, text bool) {
	f := setup(t)
	// Adding and dropping a column leaves the tuple with a hole, so a
	// decoder that assumed the migration's column order would misread it.
	f.exec(t, "ALTER TABLE outbox.events ADD COLUMN extra int")
	f.exec(t, "ALTER TABLE outbox.events DROP COLUMN extra")
	var src *cdc.Source
	if text {
		u, err := url.Parse(f.cfg.DatabaseURL)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("timezone", "Asia/Kolkata")
		u.RawQuery = q.Encode()
		f.cfg.DatabaseURL = u.String()
		if src, err = cdc.New(f.cfg); err != nil {
			t.Fatal(err)
		}
		cdc.UseTextTuples(src)
		if err := src.Start(context.Background(), relay.Position{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { src.Close(context.Background()) })
	} else {
		src = f.start(t, relay.Position{})
	}
	c := newCore(t, f.url, src, relay.Position{})

	var eventID string
	var created time.Time
	err := f.conn.QueryRow(context.Background(), `INSERT INTO outbox.events (topic, key, payload, headers)
		VALUES ('orders', 'order-1', '\x00ff5c78'::bytea, '{"trace-id": "abc", "q": "\"quoted\""}')
		RETURNING event_id::text, created_at`).Scan(&eventID, &created)
	if err != nil {
		t.Fatal(err)
	}
	f.exec(t, "INSERT INTO outbox.events (topic) VALUES ('tombstones')")
	got := c.collect(2, 20*time.Second)

	e := got[0]
	if e.Topic != "orders" || string(e.Key) != "order-1" || !bytes.Equal(e.Payload, []byte{0x00, 0xff, 0x5c, 0x78}) {
		t.Fatalf("first event = %+v", e)
	}
	if string(e.Headers) != `{"q": "\"quoted\"", "trace-id": "abc"}` {
		t.Fatalf("headers = %s", e.Headers)
	}
	if e.EventID != eventID || !e.CreatedAt.Equal(created) || e.ID == 0 {
		t.Fatalf("event id %q created %v, want %q %v", e.EventID, e.CreatedAt, eventID, created)
	}
	n := got[1]
	if n.Topic != "tombstones" || n.Key != nil || n.Payload != nil || n.Headers != nil {
		t.Fatalf("NULL columns arrived as key %q payload %q headers %q", n.Key, n.Payload, n.Headers)
	}
	if !e.Position.Less(n.Position) {
		t.Fatalf("positions %v then %v", e.Position, n.Position)
	}
}

// Writers commit concurrently; every event arrives once, in commit order
// per key, and a rolled-back transaction's events never arrive.
func TestConcurrentWritersExactlyOnceInCommitOrder(t *testing.T) {
	t.Parallel()
	f := setup(t)
	_, c := f.startCore(t, relay.Position{})
	c.max = 100

	const writers, txs, perTx, keys = 6, 50, 5, 10
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, f.url)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close(ctx)
			for i := 0; i < txs; i++ {
				tx, err := conn.Begin(ctx)
				if err != nil {
					errs <- err
					return
				}
				for j := 0; j < perTx; j++ {
					// The payload "w/i/j" lets the test recompute order.
					key := fmt.Sprintf("key-%d", (w*txs*perTx+i*perTx+j)%keys)
					if _, err := tx.Exec(ctx, "INSERT INTO outbox.events (topic, key, payload) VALUES ('t', $1, convert_to($2, 'UTF8'))",
						key, fmt.Sprintf("%d/%d/%d", w, i, j)); err != nil {
						errs <- err
						return
					}
				}
				if i%10 == 3 {
					tx.Rollback(ctx)
					continue
				}
				if err := tx.Commit(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	want := writers * (txs - txs/10) * perTx
	got := c.collect(want, 60*time.Second)
	c.quiet(500 * time.Millisecond)
	checkOrder(t, got)

	seen := checkNoneTwice(t, got)
	lastByWriterKey := map[string]string{}
	for _, e := range got {
		p := string(e.Payload)
		var w, i, j int
		fmt.Sscanf(p, "%d/%d/%d", &w, &i, &j)
		if i%10 == 3 {
			t.Fatalf("event %s of a rolled-back transaction arrived", p)
		}
		// One writer commits its transactions one after another, so its
		// events for a key arrive in its own order.
		wk := fmt.Sprintf("%d %s", w, e.Key)
		if prev, ok := lastByWriterKey[wk]; ok {
			var pi, pj int
			fmt.Sscanf(prev, "%d/%d/%d", new(int), &pi, &pj)
			if pi > i || (pi == i && pj > j) {
				t.Fatalf("key %s: %s arrived after %s", e.Key, prev, p)
			}
		}
		lastByWriterKey[wk] = p
	}
	if len(seen) != want {
		t.Fatalf("%d distinct events, want %d", len(seen), want)
	}
	// Events of one transaction arrive together, in insert order.
	for k := 1; k < len(got); k++ {
		if got[k].Position.Major == got[k-1].Position.Major && got[k].Position.Minor != got[k-1].Position.Minor+1 {
			t.Fatalf("gap inside a transaction: %v then %v", got[k-1].Position, got[k].Position)
		}
	}
}

// A transaction that takes a low id and commits last arrives after the
// transactions that committed before it.
func TestLowIDCommittedLastArrivesLast(t *testing.T) {
	t.Parallel()
	f := setup(t)
	_, c := f.startCore(t, relay.Position{})
	ctx := context.Background()

	tx := f.openTx(t, "k", "slow")
	f.exec(t, "INSERT INTO outbox.events (topic, key, payload) VALUES ('t', 'k', 'fast-1')")
	f.exec(t, "INSERT INTO outbox.events (topic, key, payload) VALUES ('t', 'k', 'fast-2')")
	got := c.collect(2, 20*time.Second)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got = c.collect(3, 20*time.Second)
	order := []string{string(got[0].Payload), string(got[1].Payload), string(got[2].Payload)}
	if order[0] != "fast-1" || order[1] != "fast-2" || order[2] != "slow" {
		t.Fatalf("arrival order %v, want fast-1 fast-2 slow", order)
	}
	if got[2].ID > got[0].ID {
		t.Fatalf("the slow transaction's id %d is not the lowest (%d)", got[2].ID, got[0].ID)
	}
	checkOrder(t, got)
}

// One transaction of 100,000 events arrives whole and in order, in batches
// no larger than max, with nothing of other transactions mixed in.
func TestHundredThousandEventTransaction(t *testing.T) {
	t.Parallel()
	f := setup(t)
	_, c := f.startCore(t, relay.Position{})
	const n = 100_000
	f.exec(t, "INSERT INTO outbox.events (topic) VALUES ('before')")
	f.exec(t, "INSERT INTO outbox.events (topic, key, payload) SELECT 'big', 'k' || (g % 100), convert_to(g::text, 'UTF8') FROM generate_series(1, $1) AS g", n)
	f.exec(t, "INSERT INTO outbox.events (topic) VALUES ('after')")
	got := c.collect(n+2, 120*time.Second)
	if got[0].Topic != "before" || got[n+1].Topic != "after" {
		t.Fatalf("first %q last %q", got[0].Topic, got[n+1].Topic)
	}
	major := got[1].Position.Major
	for i := 1; i <= n; i++ {
		e := got[i]
		if e.Topic != "big" || e.Position.Major != major || e.Position.Minor != uint64(i-1) || string(e.Payload) != fmt.Sprint(i) {
			t.Fatalf("event %d of the big transaction: %+v", i, e)
		}
	}
	for _, b := range c.batches {
		if b > c.max {
			t.Fatalf("a batch of %d events, max %d", b, c.max)
		}
	}
	checkOrder(t, got)
}

// Close and a new Source started from the last acknowledged position
// resume with nothing lost and nothing delivered again, even when the
// last acknowledgement ended inside a transaction.
func TestRestartResumesFromAcknowledgedPosition(t *testing.T) {
	t.Parallel()
	f := setup(t)
	src, c := f.startCore(t, relay.Position{})
	c.max = 7
	f.exec(t, "INSERT INTO outbox.events (topic, payload) SELECT 't', convert_to(g::text, 'UTF8') FROM generate_series(1, 20) AS g")
	f.exec(t, "INSERT INTO outbox.events (topic, payload) SELECT 't', convert_to(g::text, 'UTF8') FROM generate_series(21, 30) AS g")
	first := append([]relay.Event(nil), c.collect(7, 20*time.Second)...)
	if err := src.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	from := c.acked
	if from.Minor != 6 {
		t.Fatalf("acknowledged %v, want the middle of the first transaction", from)
	}

	// A delivered but unacknowledged batch must come again.
	src2, c2 := f.startCore(t, from)
	events, err := src2.Next(context.Background(), 5)
	if err != nil {
		t.Fatal(err)
	}
	if err := src2.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if events[0].Position != (relay.Position{Major: from.Major, Minor: 7}) {
		t.Fatalf("after restart the first event is at %v, want right after %v", events[0].Position, from)
	}

	_, c3 := f.startCore(t, from)
	rest := c3.collect(23, 20*time.Second)
	c3.quiet(500 * time.Millisecond)
	all := append(first, rest...)
	checkOrder(t, all)
	for i, e := range all {
		if string(e.Payload) != fmt.Sprint(i+1) {
			t.Fatalf("event %d has payload %s", i, e.Payload)
		}
	}
	_ = c2
}

// The slot's confirmed flush position stays before events that are not
// acknowledged, and advances while the outbox is idle and another table is
// busy.
func TestFlushOnlyAfterAcknowledgement(t *testing.T) {
	t.Parallel()
	f := setup(t)
	src, c := f.startCore(t, relay.Position{})
	admin := pgtest.Connect(t, f.url)
	slot := f.cfg.SlotName
	ctx := context.Background()

	f.exec(t, "CREATE TABLE busy (x int)")
	start := slotFlush(t, admin, slot)
	f.exec(t, "INSERT INTO outbox.events (topic) VALUES ('a')")
	events, err := src.Next(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	// Delivered, not acknowledged: other traffic and heartbeats must not
	// move the slot past the event.
	for i := 0; i < 10; i++ {
		f.exec(t, "INSERT INTO busy VALUES (1)")
		time.Sleep(100 * time.Millisecond) // deliberate pause: other traffic and heartbeats over a second, which must not move the slot
	}
	if got := slotFlush(t, admin, slot); got > events[0].Position.Major {
		t.Fatalf("confirmed flush %X moved past the unacknowledged event at %X", got, events[0].Position.Major)
	}
	c.deliver(ctx, events)
	waitFor(t, 10*time.Second, "the flush position to pass the acknowledged event", func() bool {
		return slotFlush(t, admin, slot) > events[0].Position.Major
	})

	// Idle outbox, busy table: the slot keeps up with the WAL.
	for i := 0; i < 5; i++ {
		f.exec(t, "INSERT INTO busy VALUES (2)")
	}
	var walNow uint64
	if err := admin.QueryRow(ctx, "SELECT (pg_current_wal_lsn() - '0/0')::numeric::bigint").Scan(&walNow); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the flush position to reach the busy table's WAL", func() bool {
		return slotFlush(t, admin, slot) >= walNow
	})
	if slotFlush(t, admin, slot) <= start {
		t.Fatal("the flush position never moved")
	}
	lag, retained, err := src.SlotLag(ctx)
	if err != nil || lag < 0 || retained < lag {
		t.Fatalf("SlotLag = %d, %d, %v", lag, retained, err)
	}
}

// TestColumnsOfDomainTypes: columns whose types are domains, which the
// fast decoder leaves to pgtype, arrive whole in binary format.
func TestColumnsOfDomainTypes(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.exec(t, "CREATE DOMAIN outbox.event_key AS text CHECK (VALUE <> '')")
	f.exec(t, "CREATE DOMAIN outbox.event_payload AS bytea")
	f.exec(t, "ALTER TABLE outbox.events ALTER COLUMN key TYPE outbox.event_key, ALTER COLUMN payload TYPE outbox.event_payload")
	_, c := f.startCore(t, relay.Position{})
	f.exec(t, `INSERT INTO outbox.events (topic, key, payload) VALUES ('orders', 'order-1', '\x00ff'::bytea), ('orders', NULL, NULL)`)
	got := c.collect(2, 20*time.Second)
	if got[0].Topic != "orders" || string(got[0].Key) != "order-1" || !bytes.Equal(got[0].Payload, []byte{0, 0xff}) {
		t.Fatalf("first event = %+v", got[0])
	}
	if got[1].Key != nil || got[1].Payload != nil {
		t.Fatalf("NULL key and payload arrived as %q, %q", got[1].Key, got[1].Payload)
	}
}
