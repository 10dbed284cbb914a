package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
)

// LockedConfig shapes a load of lock-serialized writers, the case where
// transaction ids and commit order disagree.
type LockedConfig struct {
	URL     string
	Topic   string
	Writers int
	// Events is the total number of committed events; Keys the number of
	// business rows they contend on.
	Events, Keys int
	// RollbackEvery rolls back one transaction in this many (0: never).
	RollbackEvery int
	Seed          uint64
	// EventFirst writes the event row before taking the lock: its id then
	// follows the order of the INSERTs, not of the commits. Outbox rows are
	// immutable, so the event cannot carry the version it gets after the
	// lock: its payload has Seq 0, and the version goes to
	// relay_test_versions in the same transaction (see LockedVersions).
	EventFirst bool
}

// SetupLocked creates the business tables the locked writers use:
// relay_test_accounts (one row per key, with a version) and
// relay_test_elsewhere (a table a transaction writes first to take its
// transaction id early).
func SetupLocked(ctx context.Context, url string, keys int) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS public.relay_test_accounts (key text PRIMARY KEY, version int NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS public.relay_test_elsewhere (n bigint);
CREATE TABLE IF NOT EXISTS public.relay_test_versions (id text PRIMARY KEY, version int NOT NULL)`)
	if err == nil {
		_, err = conn.Exec(ctx, `INSERT INTO public.relay_test_accounts (key) SELECT 'hot-' || k FROM generate_series(0, $1 - 1) AS k ON CONFLICT DO NOTHING`, keys)
	}
	if err != nil {
		return fmt.Errorf("creating the business tables: %w", err)
	}
	return nil
}

// LockedTx is one lock-serialized writer transaction on an open tx: it
// writes a row elsewhere (taking a transaction id), waits pause, locks the
// key's business row with SELECT ... FOR UPDATE, bumps its version and
// writes an event whose Seq is the new version. So the key's versions, and
// its events' Seq, follow the order in which the transactions commit.
func LockedTx(ctx context.Context, tx pgx.Tx, topic, key, id string, pause time.Duration) (Payload, error) {
	return lockedTx(ctx, tx, topic, key, id, pause, false)
}

func lockedTx(ctx context.Context, tx pgx.Tx, topic, key, id string, pause time.Duration, eventFirst bool) (Payload, error) {
	if _, err := tx.Exec(ctx, `INSERT INTO public.relay_test_elsewhere (n) VALUES (1)`); err != nil {
		return Payload{}, err
	}
	if eventFirst {
		body, _ := json.Marshal(Payload{ID: id, Key: key})
		if _, err := tx.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload, headers) VALUES ($1, $2, $3, '{"test":"e2e"}')`, topic, key, body); err != nil {
			return Payload{}, err
		}
	}
	if pause > 0 {
		time.Sleep(pause)
	}
	var version int
	if err := tx.QueryRow(ctx, `SELECT version FROM public.relay_test_accounts WHERE key = $1 FOR UPDATE`, key).Scan(&version); err != nil {
		return Payload{}, err
	}
	version++
	if _, err := tx.Exec(ctx, `UPDATE public.relay_test_accounts SET version = $2 WHERE key = $1`, key, version); err != nil {
		return Payload{}, err
	}
	p := Payload{ID: id, Key: key, Seq: version}
	body, _ := json.Marshal(p)
	if eventFirst {
		_, err := tx.Exec(ctx, `INSERT INTO public.relay_test_versions (id, version) VALUES ($1, $2)`, id, version)
		return p, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload, headers) VALUES ($1, $2, $3, '{"test":"e2e"}')`, topic, key, body); err != nil {
		return Payload{}, err
	}
	return p, nil
}

// WriteLocked runs cfg.Writers writers of LockedTx transactions on random
// keys until cfg.Events events are committed, recording them in ledger.
// Every writer may touch every key, so the transactions of one key overlap
// and are serialized only by the row lock; the pause before the lock is
// random (0-2 ms) so that transaction ids run backwards often.
func WriteLocked(ctx context.Context, cfg LockedConfig, ledger *Ledger) error {
	if err := SetupLocked(ctx, cfg.URL, cfg.Keys); err != nil {
		return err
	}
	return EachWriter(WriterConfig{Writers: cfg.Writers, Events: cfg.Events}, func(w, n int) error {
		conn, err := pgx.Connect(ctx, cfg.URL)
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		rng := rand.New(rand.NewPCG(uint64(w), cfg.Seed))
		for txNo, written := 1, 0; written < n; txNo++ {
			key := fmt.Sprintf("hot-%d", rng.IntN(cfg.Keys))
			pause := time.Duration(rng.IntN(2000)) * time.Microsecond
			tx, err := conn.Begin(ctx)
			if err != nil {
				return err
			}
			p, err := lockedTx(ctx, tx, cfg.Topic, key, fmt.Sprintf("locked-s%d-w%d-t%d", cfg.Seed, w, txNo), pause, cfg.EventFirst)
			if err != nil {
				tx.Rollback(ctx)
				return err
			}
			if cfg.RollbackEvery > 0 && txNo%cfg.RollbackEvery == 0 {
				if err := tx.Rollback(ctx); err != nil {
					return err
				}
				ledger.Note([]Payload{p}, false)
				continue
			}
			if err := tx.Commit(ctx); err != nil {
				return err
			}
			ledger.Note([]Payload{p}, true)
			written++
		}
		return nil
	})
}

// LockedVersions reads the versions EventFirst transactions recorded, by
// event id.
func LockedVersions(ctx context.Context, url string) (map[string]int, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, `SELECT id, version FROM public.relay_test_versions`)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for rows.Next() {
		var id string
		var v int
		if err := rows.Scan(&id, &v); err != nil {
			return nil, err
		}
		out[id] = v
	}
	return out, rows.Err()
}

// WithVersions returns records with each test payload's Seq set to its
// event's version in versions (from LockedVersions), for Check; a record
// whose event has no version is left as it is.
func WithVersions(records []Record, versions map[string]int) []Record {
	out := make([]Record, len(records))
	for i, r := range records {
		var p Payload
		if json.Unmarshal(r.Value, &p) == nil {
			if v, ok := versions[p.ID]; ok {
				p.Seq = v
				r.Value, _ = json.Marshal(p)
			}
		}
		out[i] = r
	}
	return out
}
