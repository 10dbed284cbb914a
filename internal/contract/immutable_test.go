package contract_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
)

// TestImmutableRows, with each reader: while 8 writers commit 2,000
// events and the relay is SIGKILLed at least twice, a service tries to
// change its events, round after round: UPDATE and DELETE of a row in the
// transaction that inserted it, UPDATE and DELETE of a committed row,
// TRUNCATE. Each is refused with the trigger's error (SQLSTATE 23001,
// naming the operation, with a detail and a hint saying what to do
// instead), so its transaction rolls back, or the committed row stays as
// it was. A savepoint rolled back withdraws the event written after it.
// The log holds every committed event exactly once, in per-key order, as
// its INSERT wrote it, nothing of a transaction or savepoint that rolled
// back, and the outbox drains: the relay's own acknowledgement deletes
// the rows.
func TestImmutableRows(t *testing.T) {
	eachReader(t, testImmutableRows)
}

func testImmutableRows(t *testing.T, ctx context.Context, e *relayEnv) {
	ledger := e2e.NewLedger()
	p := e.start()
	writers := e2e.WriteAsync(ctx, e2e.CrashLoad(e.url, 2000, 200), ledger)
	stop := make(chan struct{})
	var rounds int
	roundsDone := make(chan error, 1)
	conn := pgtest.Connect(t, e.url)
	go func() {
		for rounds = 0; ; rounds++ {
			select {
			case <-stop:
				roundsDone <- nil
				return
			case <-time.After(50 * time.Millisecond):
			}
			if err := changeRound(ctx, conn, rounds, ledger); err != nil {
				roundsDone <- fmt.Errorf("round %d: %w", rounds, err)
				return
			}
		}
	}()
	allDone := make(chan error, 1)
	go func() {
		err := <-writers
		close(stop)
		allDone <- errors.Join(err, <-roundsDone)
	}()
	kills := e.killLoop(ctx, p, allDone, 2)
	n := e2e.CheckLog(t, e.dataDir, ledger)
	t.Logf("%s: %d events exactly once in per-key order, as inserted, through %d SIGKILLs; %d rounds of refused UPDATE, DELETE and TRUNCATE; %d rolled-back events absent",
		e.source, n, kills, rounds, len(ledger.RolledBack))
}

type execer interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}

// insertEvent writes p as a test event of topic orders.
func insertEvent(ctx context.Context, q execer, p e2e.Payload) error {
	body, _ := json.Marshal(p)
	_, err := q.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload, headers) VALUES ('orders', $1, $2, '{"test":"e2e"}')`, p.Key, body)
	return err
}

// refused checks that err is the immutability trigger's error for op.
func refused(err error, op string) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return fmt.Errorf("%s of an outbox row: got %v, want the immutability error", op, err)
	}
	if pgErr.Code != "23001" || !strings.Contains(pgErr.Message, "outbox events are immutable: "+op+" on outbox.events refused") ||
		!strings.Contains(pgErr.Hint, "roll back the transaction or a savepoint") || !strings.Contains(pgErr.Detail, "WAL reader") {
		return fmt.Errorf("%s of an outbox row: error %s %q (detail %q, hint %q)", op, pgErr.Code, pgErr.Message, pgErr.Detail, pgErr.Hint)
	}
	return nil
}

// changeRound tries every change a service might make to its events,
// records in ledger what committed and what rolled back, and fails
// unless each change was refused.
func changeRound(ctx context.Context, conn *pgx.Conn, round int, ledger *e2e.Ledger) error {
	changes := []struct{ op, sql string }{
		{"UPDATE", `UPDATE outbox.events SET payload = convert_to('{"changed":true}', 'UTF8') WHERE key = $1`},
		{"DELETE", `DELETE FROM outbox.events WHERE key = $1`},
	}
	// In the inserting transaction: refused, and the transaction rolls
	// back.
	for _, c := range changes {
		key := fmt.Sprintf("own-%s-%d", c.op, round)
		ev := e2e.Payload{ID: key + "-0", Key: key}
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		if err := insertEvent(ctx, tx, ev); err != nil {
			tx.Rollback(ctx)
			return err
		}
		_, err = tx.Exec(ctx, c.sql, key)
		tx.Rollback(ctx)
		ledger.Note([]e2e.Payload{ev}, false)
		if err := refused(err, c.op); err != nil {
			return err
		}
	}
	// After the commit: refused, and the row stays as it was written.
	key := fmt.Sprintf("committed-%d", round)
	ev := e2e.Payload{ID: key + "-0", Key: key}
	if err := insertEvent(ctx, conn, ev); err != nil {
		return err
	}
	ledger.Record(ev)
	for _, c := range changes {
		_, err := conn.Exec(ctx, c.sql, key)
		if err := refused(err, c.op); err != nil {
			return err
		}
	}
	_, err := conn.Exec(ctx, `TRUNCATE outbox.events`)
	if err := refused(err, "TRUNCATE"); err != nil {
		return err
	}
	// A savepoint rolled back withdraws what was written after it.
	key = fmt.Sprintf("savepoint-%d", round)
	a, b, c := e2e.Payload{ID: key + "-a", Key: key, Seq: 0}, e2e.Payload{ID: key + "-b", Key: key, Seq: 1}, e2e.Payload{ID: key + "-c", Key: key, Seq: 1}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if err := insertEvent(ctx, tx, a); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "SAVEPOINT s"); err != nil {
			return err
		}
		if err := insertEvent(ctx, tx, b); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT s"); err != nil {
			return err
		}
		return insertEvent(ctx, tx, c)
	})
	if err != nil {
		return err
	}
	ledger.Note([]e2e.Payload{a, c}, true)
	ledger.Note([]e2e.Payload{b}, false)
	return nil
}
