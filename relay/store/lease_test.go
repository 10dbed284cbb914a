package store_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/relay/store"
)

// takeOver runs a standby's takeover transaction as relay/leadership.go
// does and returns the new epoch, 0 when the lease had moved.
func (f *fixture) takeOver(seen store.Lease, holder string, leaseMS int64) (int64, error) {
	var got int64
	err := pgx.BeginFunc(f.ctx, f.conn, func(tx pgx.Tx) error {
		epoch, err := f.s.LockEpoch(f.ctx, tx)
		if err != nil || epoch != seen.Epoch {
			return err
		}
		if epoch, err = f.s.BumpEpoch(f.ctx, tx, epoch, holder); err != nil {
			return err
		}
		swapped, err := f.s.SwapLease(f.ctx, tx, seen.Epoch, seen.Renewals, epoch, leaseMS)
		if err != nil {
			return err
		}
		if !swapped {
			return errMoved
		}
		got = epoch
		return nil
	})
	if errors.Is(err, errMoved) {
		return 0, nil
	}
	return got, err
}

var errMoved = errors.New("the lease moved")

func TestLease(t *testing.T) {
	t.Run("ObserveMigrated", func(t *testing.T) {
		f := setup(t)
		l, err := f.s.ObserveLease(f.ctx, f.conn)
		if err != nil {
			t.Fatal(err)
		}
		if l != (store.Lease{Epoch: 0, Renewals: 0, Released: true, LeaseMS: 1}) {
			t.Fatalf("migrated lease %+v", l)
		}
	})
	t.Run("TakeOverBumpsEpochAndSwapsLease", func(t *testing.T) {
		f := setup(t)
		seen, _ := f.s.ObserveLease(f.ctx, f.conn)
		epoch, err := f.takeOver(seen, "a", 5000)
		if err != nil || epoch != 1 {
			t.Fatalf("takeover: epoch %d, %v", epoch, err)
		}
		l, _ := f.s.ObserveLease(f.ctx, f.conn)
		if l != (store.Lease{Epoch: 1, Renewals: 0, Released: false, LeaseMS: 5000}) {
			t.Fatalf("lease after takeover %+v", l)
		}
		var holder string
		if err := f.conn.QueryRow(f.ctx, `SELECT holder FROM `+schema+`.leadership WHERE epoch = 1`).Scan(&holder); err != nil || holder != "a" {
			t.Fatalf("leadership holder %q, %v", holder, err)
		}
	})
	t.Run("SwapRefusesAMovedLease", func(t *testing.T) {
		f := setup(t)
		seen, _ := f.s.ObserveLease(f.ctx, f.conn)
		if _, err := f.takeOver(seen, "a", 5000); err != nil {
			t.Fatal(err)
		}
		now, _ := f.s.ObserveLease(f.ctx, f.conn)
		if ok, err := f.s.RenewLease(f.ctx, f.conn, now.Epoch); err != nil || !ok {
			t.Fatalf("renewal: %v %v", ok, err)
		}
		// b saw epoch 1 before the renewal: its swap must not apply, and
		// its transaction (with the bumped epoch) rolls back.
		epoch, err := f.takeOver(now, "b", 5000)
		if err != nil || epoch != 0 {
			t.Fatalf("takeover over a renewed lease: epoch %d, %v", epoch, err)
		}
		if e := f.one(`SELECT epoch FROM ` + schema + `.leadership`); e != 1 {
			t.Fatalf("leadership epoch %d after a refused takeover, want 1", e)
		}
		l, _ := f.s.ObserveLease(f.ctx, f.conn)
		if l.Epoch != 1 || l.Renewals != 1 {
			t.Fatalf("lease after a refused takeover %+v", l)
		}
	})
	t.Run("BumpFromAStaleEpoch", func(t *testing.T) {
		f := setup(t)
		_, err := f.s.BumpEpoch(f.ctx, f.conn, 7, "x")
		if !errors.Is(err, pgx.ErrNoRows) {
			t.Fatalf("bump of a stale epoch: %v, want pgx.ErrNoRows", err)
		}
	})
	t.Run("Renew", func(t *testing.T) {
		f := setup(t)
		seen, _ := f.s.ObserveLease(f.ctx, f.conn)
		f.takeOver(seen, "a", 5000)
		for _, c := range []struct {
			name    string
			epoch   int64
			release bool
			want    bool
		}{
			{"own epoch", 1, false, true},
			{"stale epoch", 0, false, false},
			{"released", 1, true, false},
		} {
			if c.release {
				if err := f.s.ReleaseLease(f.ctx, f.conn, c.epoch); err != nil {
					t.Fatal(err)
				}
			}
			before, _ := f.s.ObserveLease(f.ctx, f.conn)
			ok, err := f.s.RenewLease(f.ctx, f.conn, c.epoch)
			after, _ := f.s.ObserveLease(f.ctx, f.conn)
			if err != nil || ok != c.want {
				t.Fatalf("%s: renewed %v, %v; want %v", c.name, ok, err, c.want)
			}
			if grew := after.Renewals - before.Renewals; (grew == 1) != c.want {
				t.Fatalf("%s: renewals grew by %d", c.name, grew)
			}
		}
	})
	t.Run("ReleaseOnlyOwnEpoch", func(t *testing.T) {
		f := setup(t)
		seen, _ := f.s.ObserveLease(f.ctx, f.conn)
		f.takeOver(seen, "a", 5000)
		f.s.ReleaseLease(f.ctx, f.conn, 0)
		if l, _ := f.s.ObserveLease(f.ctx, f.conn); l.Released {
			t.Fatal("a stale epoch released the lease")
		}
		f.s.ReleaseLease(f.ctx, f.conn, 1)
		if l, _ := f.s.ObserveLease(f.ctx, f.conn); !l.Released {
			t.Fatal("the leader's release did not mark the lease released")
		}
	})
	t.Run("Fence", func(t *testing.T) {
		f := setup(t)
		for _, c := range []struct {
			epoch int64
			want  bool
		}{{0, true}, {1, false}, {-1, false}} {
			var held bool
			err := pgx.BeginFunc(f.ctx, f.conn, func(tx pgx.Tx) error {
				var err error
				held, err = f.s.Fence(f.ctx, tx, c.epoch)
				return err
			})
			if err != nil || held != c.want {
				t.Fatalf("fence of epoch %d: %v, %v; want %v", c.epoch, held, err, c.want)
			}
		}
	})
	t.Run("FenceLetsTheTransactionDeleteOutboxRows", func(t *testing.T) {
		f := setup(t)
		ids := f.events(2, "t", nil)
		_, err := f.s.DeleteIDs(f.ctx, f.conn, ids[:1])
		if pgCode(err) != "23001" {
			t.Fatalf("unfenced delete: %v, want restrict_violation", err)
		}
		if err := f.fenced(func(tx pgx.Tx) error { _, err := f.s.DeleteIDs(f.ctx, tx, ids[:1]); return err }); err != nil {
			t.Fatal(err)
		}
		// The permission is the transaction's only.
		if _, err := f.s.DeleteIDs(f.ctx, f.conn, ids[1:]); pgCode(err) != "23001" {
			t.Fatalf("delete after the fenced transaction: %v, want restrict_violation", err)
		}
	})
	t.Run("FenceHoldsOffATakeover", func(t *testing.T) {
		f := setup(t)
		tx, err := f.conn.Begin(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(f.ctx)
		if held, err := f.s.Fence(f.ctx, tx, 0); err != nil || !held {
			t.Fatalf("fence: %v %v", held, err)
		}
		other := pgtest.Connect(t, f.url)
		if _, err := other.Exec(f.ctx, `SET lock_timeout = '300ms'`); err != nil {
			t.Fatal(err)
		}
		err = pgx.BeginFunc(f.ctx, other, func(otx pgx.Tx) error {
			_, err := f.s.LockEpoch(f.ctx, otx)
			return err
		})
		if pgCode(err) != "55P03" {
			t.Fatalf("LockEpoch while an acknowledgement held the fence: %v, want lock_not_available", err)
		}
		if err := tx.Commit(f.ctx); err != nil {
			t.Fatal(err)
		}
		err = pgx.BeginFunc(f.ctx, other, func(otx pgx.Tx) error {
			_, err := f.s.LockEpoch(f.ctx, otx)
			return err
		})
		if err != nil {
			t.Fatalf("LockEpoch after the fenced transaction: %v", err)
		}
	})
}
