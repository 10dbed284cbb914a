package contract_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/testbin"
)

// debeziumDDL is the outbox table of Debezium's Outbox Event Router
// documentation, plus one extra column (published as a header here).
const debeziumDDL = `CREATE TABLE public.outboxevent (
    id            uuid NOT NULL PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid   varchar(255) NOT NULL,
    type          varchar(255) NOT NULL,
    payload       jsonb,
    test          varchar(255)
)`

// TestDebeziumLayout, with each reader: a table created with Debezium's
// documented outbox DDL is attached with `relay table attach
// --header-columns type,test` (Debezium's defaults otherwise), and four
// writers insert 1,600 events into it with plain INSERTs, of two
// aggregate types, one transaction in 20 rolled back and half of them
// deleting their rows after inserting them (Debezium's advice to keep the
// table empty), while the relay is SIGKILLed at least 3 times. Each
// aggregate type's topic (outbox.event.<aggregatetype>) holds its events
// exactly once, in per-key (aggregateid) order, each with the row's id as
// relay-event-id and its type and test columns as headers; nothing rolled
// back. Detaching stops the copying.
func TestDebeziumLayout(t *testing.T) {
	eachReader(t, testDebeziumLayout)
}

func testDebeziumLayout(t *testing.T, ctx context.Context, e *relayEnv) {
	admin := pgtest.Connect(t, e.url)
	if _, err := admin.Exec(ctx, debeziumDDL); err != nil {
		t.Fatal(err)
	}
	res, err := testbin.Run(ctx, e.bin, nil, "table", "attach", "--database-url", e.url, "--table", "public.outboxevent", "--header-columns", "type,test")
	if err != nil || res.Code != 0 {
		t.Fatalf("relay table attach: %v, exit %d: %s%s", err, res.Code, res.Stdout, res.Stderr)
	}

	p := e.start()
	ledger := e2e.NewLedger()
	var mu sync.Mutex
	ids := map[string]string{} // event id to the row's uuid
	writeDone := make(chan error, 1)
	go func() {
		const writers = 4
		writeDone <- e2e.EachConn(ctx, e.url, writers, func(conn *pgx.Conn, w int) error {
			return writeDebezium(ctx, conn, w, writers, 1600/writers, ledger, func(id, row string) {
				mu.Lock()
				ids[id] = row
				mu.Unlock()
			})
		})
	}()
	kills := e.killLoop(ctx, p, writeDone, 3)

	var records []e2e.Record
	for _, aggregate := range []string{"Order", "Customer"} {
		topic := "outbox.event." + aggregate
		for _, r := range e2e.ReadLog(t, e.dataDir, topic) {
			var pl e2e.Payload
			json.Unmarshal(r.Value, &pl)
			if !strings.HasPrefix(pl.Key, aggregate) {
				t.Errorf("event %s of aggregate %s is on topic %s", pl.ID, pl.Key, topic)
			}
			if want := ids[pl.ID]; r.Headers["relay-event-id"] != want || want == "" {
				t.Errorf("event %s: relay-event-id %q, the row's id %q", pl.ID, r.Headers["relay-event-id"], want)
			}
			if r.Headers["type"] != aggregate+"Changed" {
				t.Errorf("event %s: type header %q", pl.ID, r.Headers["type"])
			}
			records = append(records, r)
		}
	}
	n := e2e.Check(t, records, ledger)
	if n != len(ledger.Committed) {
		t.Fatalf("the log has %d records for %d committed events", n, len(ledger.Committed))
	}

	res, err = testbin.Run(ctx, e.bin, nil, "table", "detach", "--database-url", e.url, "--table", "public.outboxevent")
	if err != nil || res.Code != 0 {
		t.Fatalf("relay table detach: %v, exit %d: %s%s", err, res.Code, res.Stdout, res.Stderr)
	}
	if _, err := admin.Exec(ctx, `INSERT INTO public.outboxevent (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'Order', 'x', 'y', '{}')`); err != nil {
		t.Fatal(err)
	}
	var left int
	// Only the row of that insert counts: the relay's heartbeats go through
	// the outbox too, and one may be waiting for its acknowledgement.
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM outbox.events WHERE key = 'x'").Scan(&left); err != nil || left != 0 {
		t.Fatalf("after detach an insert still reached the outbox: %d rows, %v", left, err)
	}
	t.Logf("%s: %d events from Debezium's table exactly once in per-key order on outbox.event.<aggregatetype>, through %d SIGKILLs; %d rolled back absent",
		e.source, n, kills, len(ledger.RolledBack))
}

// writeDebezium is writer w of writers: n committed events in transactions
// of one to five plain INSERTs into public.outboxevent, on aggregates of
// its own (aggregateid k with k % writers == w); one transaction in 20
// rolls back, and every other one deletes its rows before committing.
func writeDebezium(ctx context.Context, conn *pgx.Conn, w, writers, n int, ledger *e2e.Ledger, noteID func(id, row string)) error {
	rng := rand.New(rand.NewPCG(uint64(w), 5))
	seq := map[string]int{}
	for txNo, written := 1, 0; written < n; txNo++ {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		var batch []e2e.Payload
		var rows []string
		next := map[string]int{}
		for range min(1+rng.IntN(5), n-written) {
			aggregate := []string{"Order", "Customer"}[rng.IntN(2)]
			key := fmt.Sprintf("%s-%d", aggregate, w+writers*rng.IntN(25))
			s, ok := next[key]
			if !ok {
				s = seq[key]
			}
			next[key] = s + 1
			pl := e2e.Payload{ID: fmt.Sprintf("dbz-w%d-t%d-%d", w, txNo, len(batch)), Key: key, Seq: s}
			body, _ := json.Marshal(pl)
			var row string
			if err := tx.QueryRow(ctx, `INSERT INTO public.outboxevent (id, aggregatetype, aggregateid, type, payload, test)
VALUES (gen_random_uuid(), $1, $2, $3, $4, 'e2e') RETURNING id::text`, aggregate, key, aggregate+"Changed", string(body)).Scan(&row); err != nil {
				tx.Rollback(ctx)
				return err
			}
			noteID(pl.ID, row)
			batch, rows = append(batch, pl), append(rows, row)
		}
		if txNo%2 == 0 {
			if _, err := tx.Exec(ctx, `DELETE FROM public.outboxevent WHERE id = ANY($1::uuid[])`, rows); err != nil {
				tx.Rollback(ctx)
				return err
			}
		}
		if txNo%20 == 0 {
			if err := tx.Rollback(ctx); err != nil {
				return err
			}
			ledger.Note(batch, false)
			continue
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		for k, s := range next {
			seq[k] = s
		}
		ledger.Note(batch, true)
		written += len(batch)
	}
	return nil
}
