package contract_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
)

// TestEmitMessage: before any WAL reader has its slot, emit_message
// refuses to write (the message could never be published). Then, with
// the WAL reader running and SIGKILLed at least 3 times, four writers
// commit 2,000 events in transactions of one to six, each event either
// an outbox row or an emit_message (logical message), mixed on the same
// keys within transactions; one transaction in 20 rolls back. The log
// holds every committed event exactly once, rows and messages in their
// per-key (commit and statement) order, nothing rolled back; a tombstone
// message keeps its NULL value and headers. Then the poll reader refuses
// to start while the WAL reader's slot (which carried messages) exists;
// once it is dropped, the poll reader runs and emit_message is refused,
// naming the poll reader.
func TestEmitMessage(t *testing.T) {
	t.Parallel()
	e, ctx := newEnv(t, "cdc")
	admin := pgtest.Connect(t, e.url)
	emitRefused := func(want string) error {
		_, err := admin.Exec(ctx, `SELECT outbox.emit_message('orders', 'k', '{}')`)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "55000" || !strings.Contains(pgErr.Message, want) || pgErr.Hint == "" {
			return fmt.Errorf("emit_message: %v, want the refusal saying %q", err, want)
		}
		return nil
	}
	if err := emitRefused("no WAL reader of this outbox has a replication slot"); err != nil {
		t.Fatal(err)
	}

	p := e.start()
	ledger := e2e.NewLedger()
	var messages int64
	var mu sync.Mutex
	writeDone := make(chan error, 1)
	go func() {
		const writers = 4
		err := e2e.EachConn(ctx, e.url, writers, func(conn *pgx.Conn, w int) error {
			n, err := writeMixed(ctx, conn, w, writers, 2000/writers, ledger)
			mu.Lock()
			messages += n
			mu.Unlock()
			return err
		})
		if err == nil {
			// A tombstone message, then a row: once the row is deleted
			// (the outbox drained), everything before it is published.
			_, err = admin.Exec(ctx, `SELECT outbox.emit_message('tombstones', 'gone', NULL::bytea, '{"why":"deleted"}')`)
		}
		if err == nil {
			sentinel := e2e.Payload{ID: "sentinel", Key: "sentinel"}
			if err = insertEvent(ctx, admin, sentinel); err == nil {
				ledger.Record(sentinel)
			}
		}
		writeDone <- err
	}()
	kills := e.killLoop(ctx, p, writeDone, 3)
	n := e2e.CheckLog(t, e.dataDir, ledger)
	tomb := e2e.ReadLog(t, e.dataDir, "tombstones")
	if len(tomb) != 1 || tomb[0].Value != nil || tomb[0].Key != "gone" || tomb[0].Headers["why"] != "deleted" || tomb[0].Headers["relay-event-id"] == "" {
		t.Errorf("the tombstone message: %+v", tomb)
	}

	poll := newEnvOn(t, e, "poll")
	pp := poll.start()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(pp.Output(), "the outbox has logical messages only the WAL reader can publish"); time.Sleep(100 * time.Millisecond) { // condition poll: the relay's output
		if time.Now().After(deadline) {
			t.Fatal("the poll reader started although the WAL reader's slot carries logical messages")
		}
	}
	if _, err := admin.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM outbox.cdc_slots`); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for err := emitRefused("the relay reads this outbox with the poll reader"); err != nil; err = emitRefused("the relay reads this outbox with the poll reader") {
		if time.Now().After(deadline) {
			t.Fatalf("with the poll reader running: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // condition poll
	}
	pp.Stop(time.Minute)
	t.Logf("%d events (%d of them logical messages) exactly once in per-key order through %d SIGKILLs; %d rolled back absent; refused before the slot and under the poll reader",
		n, messages, kills, len(ledger.RolledBack))
}

// newEnvOn is e (its database and data directory) with another reader.
func newEnvOn(t *testing.T, e *relayEnv, source string) *relayEnv {
	return &relayEnv{t: t, url: e.url, bin: e.bin, dataDir: e.dataDir, addr: e.addr, source: source}
}

// writeMixed is writer w of writers: n committed events in transactions of
// one to six on keys of its own, each event an outbox row or a message at
// random; one transaction in 20 rolls back. It returns how many committed
// events were messages.
func writeMixed(ctx context.Context, conn *pgx.Conn, w, writers, n int, ledger *e2e.Ledger) (int64, error) {
	rng := rand.New(rand.NewPCG(uint64(w), 17))
	seq := map[string]int{}
	var messages int64
	for txNo, written := 1, 0; written < n; txNo++ {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return messages, err
		}
		var batch []e2e.Payload
		var msgs int64
		next := map[string]int{}
		for range min(1+rng.IntN(6), n-written) {
			key := fmt.Sprintf("mixed-%d", w+writers*rng.IntN(30))
			s, ok := next[key]
			if !ok {
				s = seq[key]
			}
			next[key] = s + 1
			pl := e2e.Payload{ID: fmt.Sprintf("mix-w%d-t%d-%d", w, txNo, len(batch)), Key: key, Seq: s}
			if rng.IntN(2) == 0 {
				body, _ := json.Marshal(pl)
				_, err = tx.Exec(ctx, `SELECT outbox.emit_message('orders', $1, $2::bytea, '{"test":"e2e"}')`, key, body)
				msgs++
			} else {
				err = insertEvent(ctx, tx, pl)
			}
			if err != nil {
				tx.Rollback(ctx)
				return messages, err
			}
			batch = append(batch, pl)
		}
		if txNo%20 == 0 {
			if err := tx.Rollback(ctx); err != nil {
				return messages, err
			}
			ledger.Note(batch, false)
			continue
		}
		if err := tx.Commit(ctx); err != nil {
			return messages, err
		}
		for k, s := range next {
			seq[k] = s
		}
		ledger.Note(batch, true)
		messages += msgs
		written += len(batch)
	}
	return messages, nil
}
