package contract_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
)

// maxMessage is the relay's default --max-message-bytes; relayHeaders the
// most the relay's own headers add to an event's size (relay-event-id and
// relay-created-at with a timestamp to the microsecond).
const (
	maxMessage   = 1<<20 - 512
	relayHeaders = len("relay-event-id") + 36 + len("relay-created-at") + len("2006-01-02T15:04:05.000000Z")
)

// TestLargePayloads, with each reader: two writers commit 200 events
// whose payloads are incompressible (random text) and 2,100 bytes to
// 64 KiB long, so that PostgreSQL stores them out of line in the outbox's
// TOAST table (checked), and among them ten events whose key, payload
// and headers (the relay's own included) come within 1 KiB of the default
// --max-message-bytes, and per writer one event a few bytes above it once
// the relay's headers are added and two with more row bytes than the
// limit (which the poll reader never loads); the relay is SIGKILLed at
// least twice meanwhile. The log holds every event within the limit
// exactly once, in per-key order, each payload byte for byte (none of
// them refused by the embedded broker's default topic limit); the six
// above it are in the dead letters (too_large) with their whole payload.
func TestLargePayloads(t *testing.T) {
	eachReader(t, testLargePayloads)
}

func testLargePayloads(t *testing.T, ctx context.Context, e *relayEnv) {
	p := e.start()
	admin := pgtest.Connect(t, e.url)
	var toast string
	if err := admin.QueryRow(ctx, `SELECT reltoastrelid::regclass::text FROM pg_class WHERE oid = 'outbox.events'::regclass`).Scan(&toast); err != nil {
		t.Fatal(err)
	}

	ledger := e2e.NewLedger()
	var mu sync.Mutex
	sums := map[string][32]byte{}
	over := map[string]int{} // key of an event above the limit: its payload's length
	writeDone := make(chan error, 1)
	go func() {
		writeDone <- e2e.EachConn(ctx, e.url, 2, func(conn *pgx.Conn, w int) error {
			return writeLarge(ctx, conn, toast, w, ledger, func(p e2e.Payload, body []byte, within bool) {
				mu.Lock()
				defer mu.Unlock()
				if within {
					sums[p.ID] = sha256.Sum256(body)
				} else {
					over[p.Key] = len(body)
				}
			})
		})
	}()
	kills := e.killLoop(ctx, p, writeDone, 2)

	rows, err := admin.Query(ctx, `SELECT key, reason, octet_length(payload), error FROM outbox.dead_letters ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var key, reason, msg string
		var size int
		if err := rows.Scan(&key, &reason, &size, &msg); err != nil {
			t.Fatal(err)
		}
		t.Logf("dead letter: key %s, %s, %d bytes of payload: %s", key, reason, size, msg)
	}
	rows.Close()
	records := e2e.ReadLog(t, e.dataDir, "orders")
	n := e2e.Check(t, records, ledger)
	if n != len(ledger.Committed) {
		t.Fatalf("the log has %d records for %d committed events within the limit", n, len(ledger.Committed))
	}
	var largest int
	for _, r := range records {
		var pl e2e.Payload
		json.Unmarshal(r.Value, &pl)
		if sha256.Sum256(r.Value) != sums[pl.ID] {
			t.Errorf("event %s: the log's payload (%d bytes) differs from the one written", pl.ID, len(r.Value))
		}
		largest = max(largest, len(r.Key)+len(r.Value))
	}
	if largest < maxMessage-relayHeaders-1024 {
		t.Errorf("the largest event published has %d bytes of key and payload, none came near the limit", largest)
	}
	for key, want := range over {
		var reason string
		var size int
		err := admin.QueryRow(ctx, `SELECT reason, octet_length(payload) FROM outbox.dead_letters WHERE key = $1`, key).Scan(&reason, &size)
		if err != nil {
			t.Errorf("the event of key %s above the limit: no dead letter: %v", key, err)
			continue
		}
		if reason != "too_large" || size != want {
			t.Errorf("the event of key %s above the limit: dead letter %s with %d bytes of payload, want too_large with %d", key, reason, size, want)
		}
	}
	t.Logf("%s: %d TOASTed events exactly once in per-key order, byte for byte, the largest %d bytes of key and payload, through %d SIGKILLs; %d above the limit dead-lettered",
		e.source, n, largest, kills, len(over))
}

// writeLarge is writer w: 100 events in transactions of one to three, on
// keys of its own, every 20th within 1 KiB of the limit, then three
// above it (see TestLargePayloads), each alone on a key of its own (a dead letter leaves a gap in
// its key's order); each is noted, with its payload, through note. Every
// transaction checks that its events went to the TOAST table.
func writeLarge(ctx context.Context, conn *pgx.Conn, toast string, w int, ledger *e2e.Ledger, note func(p e2e.Payload, body []byte, within bool)) error {
	rng := rand.New(rand.NewPCG(uint64(w), 99))
	seq := map[string]int{}
	headerBytes := len("test") + len("e2e")
	event := func(i int, key string, size int) (e2e.Payload, []byte) {
		pl := e2e.Payload{ID: fmt.Sprintf("large-w%d-%d", w, i), Key: key, Seq: seq[key]}
		seq[key]++
		return pl, randomBody(rng, pl, size)
	}
	for i := 0; i < 103; {
		var batch []e2e.Payload
		var bodies [][]byte
		within := i < 100
		if within {
			for j := 1 + rng.IntN(3); j > 0 && i < 100; j, i = j-1, i+1 {
				key := fmt.Sprintf("big-%d-%d", w, rng.IntN(10))
				size := 2100 + rng.IntN(64<<10-2100)
				if i%20 == 0 {
					size = maxMessage - relayHeaders - len(key) - headerBytes - rng.IntN(1024)
				}
				pl, body := event(i, key, size)
				batch, bodies = append(batch, pl), append(bodies, body)
			}
		} else {
			key := fmt.Sprintf("over-%d-%d", w, i)
			// Over once the relay's headers (at least 86 bytes) are
			// added; then over in the row alone.
			size := maxMessage - 85 - len(key) - headerBytes
			if i > 100 {
				size = maxMessage + 1 - len(key) - headerBytes
			}
			pl, body := event(i, key, size)
			batch, bodies = []e2e.Payload{pl}, [][]byte{body}
			i++
		}
		if err := insertLarge(ctx, conn, toast, batch, bodies); err != nil {
			return err
		}
		if within {
			ledger.Note(batch, true)
		}
		for k, pl := range batch {
			note(pl, bodies[k], within)
		}
	}
	return nil
}

// insertLarge writes one transaction of events and fails, rolling it
// back, unless each of them added a chunk to the TOAST table (counted in
// the transaction's snapshot, which the relay's deletes and the other
// writer's inserts do not change).
func insertLarge(ctx context.Context, conn *pgx.Conn, toast string, batch []e2e.Payload, bodies [][]byte) error {
	return pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		var before, after int64
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+toast).Scan(&before); err != nil {
			return err
		}
		for k, pl := range batch {
			if _, err := tx.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload, headers) VALUES ('orders', $1, $2, '{"test":"e2e"}')`, pl.Key, bodies[k]); err != nil {
				return err
			}
		}
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+toast).Scan(&after); err != nil {
			return err
		}
		// A chunk holds about 2 kB: every payload here takes one at least.
		if after-before < int64(len(batch)) {
			return fmt.Errorf("%d events added %d chunks to %s: their payloads were not stored out of line", len(batch), after-before, toast)
		}
		return nil
	})
}

// randomBody is p as JSON with a "pad" of random text, size bytes in all.
func randomBody(rng *rand.Rand, p e2e.Payload, size int) []byte {
	head := fmt.Sprintf(`{"id":%q,"key":%q,"seq":%d,"pad":"`, p.ID, p.Key, p.Seq)
	padLen := size - len(head) - 2
	raw := make([]byte, padLen*3/4+3)
	var seed [32]byte
	for i := range seed {
		seed[i] = byte(rng.UintN(256))
	}
	rand.NewChaCha8(seed).Read(raw)
	pad := base64.RawURLEncoding.EncodeToString(raw)[:padLen]
	return []byte(head + pad + `"}`)
}
