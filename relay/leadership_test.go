package relay

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/pgtest"
)

func leaseRelay(t *testing.T, url string, lease time.Duration) *Relay {
	t.Helper()
	r, err := New(Config{DatabaseURL: url, Lease: lease, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if r.pool, err = r.connectPool(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.pool.Close)
	return r
}

func leaseConnFor(t *testing.T, r *Relay) *leaseConn {
	t.Helper()
	lc := &leaseConn{r: r}
	if _, err := lc.get(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lc.close(context.Background()) })
	return lc
}

// leader returns a relay on url that holds the lease, with the lease's
// connection.
func leader(t *testing.T, url string, length time.Duration) (*Relay, *leaseConn, *lease) {
	t.Helper()
	r := leaseRelay(t, url, length)
	lc := leaseConnFor(t, r)
	l, err := r.acquire(context.Background(), lc.conn)
	if err != nil {
		t.Fatal(err)
	}
	return r, lc, l
}

// leaderAndStandby migrates a fresh database and returns a relay on it
// that holds the lease, with the lease's connection, and another relay on
// it that has not tried to acquire the lease yet; leases last length.
func leaderAndStandby(t *testing.T, length time.Duration) (a *Relay, ac *leaseConn, la *lease, b *Relay) {
	t.Helper()
	url, _ := pgtest.MigratedDatabase(t, "outbox")
	a, ac, la = leader(t, url, length)
	return a, ac, la, leaseRelay(t, url, length)
}

// ackFenced runs an acknowledgement-shaped transaction under l's fence.
func ackFenced(ctx context.Context, r *Relay, l *lease) error {
	return pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error { return r.fence(ctx, tx, l) })
}

// TestLeaseTakeoverFencesTheOldLeader: a leader that stops renewing (as
// when its lease session dies, or it is paused) is replaced after one lease;
// from then on its fence fails and its acknowledgements are refused by the
// epoch, even though its own connections still work.
func TestLeaseTakeoverFencesTheOldLeader(t *testing.T) {
	ctx := context.Background()
	const length = 1500 * time.Millisecond

	a, _, la, b := leaderAndStandby(t, length)
	if err := ackFenced(ctx, a, la); err != nil {
		t.Fatalf("the leader's acknowledgement: %v", err)
	}

	bc := leaseConnFor(t, b)
	acquired := make(chan *lease, 1)
	started := time.Now()
	go func() {
		l, err := b.acquire(ctx, bc.conn)
		if err != nil {
			t.Error(err)
		}
		acquired <- l
	}()
	// While a renews, b waits.
	ac := leaseConnFor(t, a)
	keepCtx, stopKeep := context.WithCancel(ctx)
	kept := make(chan error, 1)
	go func() { kept <- a.keepLease(keepCtx, ac, la) }()
	select {
	case <-acquired:
		t.Fatal("the standby took over while the leader renewed")
	case <-time.After(2 * length):
	}
	// a stops renewing but lives on.
	stopKeep()
	if err := <-kept; err != nil {
		t.Fatalf("keepLease: %v", err)
	}
	stopped := time.Now()
	lb := <-acquired
	if lb == nil {
		t.FailNow()
	}
	took := time.Since(stopped)
	t.Logf("standby waited %v in all, %v after the last renewal", time.Since(started).Round(time.Millisecond), took.Round(time.Millisecond))
	if took < length*4/5 {
		t.Fatalf("the standby took over %v after the last renewal, before the old lease (%v) could have run out", took, length)
	}
	if lb.epoch != la.epoch+1 {
		t.Fatalf("epochs: old %d, new %d", la.epoch, lb.epoch)
	}
	if err := la.Fence(); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("the old leader's fence after the takeover: %v", err)
	}
	// Even with a fence it believes in, the old epoch cannot acknowledge.
	la.extend(time.Now(), time.Hour)
	if err := ackFenced(ctx, a, la); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("the old leader's acknowledgement after the takeover: %v", err)
	}
	if err := ackFenced(ctx, b, lb); err != nil {
		t.Fatalf("the new leader's acknowledgement: %v", err)
	}
	// Nor renew: its keepLease reports the loss at once.
	if err := a.keepLease(ctx, ac, la); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("the old leader's renewal: %v", err)
	}
}

// TestTakeoverWaitsForARunningAcknowledgement: an acknowledgement that
// started under the old epoch holds the leadership row, so the takeover
// commits only after it; once the takeover committed, no acknowledgement
// of the old epoch commits.
func TestTakeoverWaitsForARunningAcknowledgement(t *testing.T) {
	ctx := context.Background()
	const length = 300 * time.Millisecond

	a, _, la, b := leaderAndStandby(t, length)
	tx, err := a.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The test holds this transaction open longer than the pool's
	// idle-in-transaction timeout (the lease) would let it.
	if _, err := tx.Exec(ctx, "SET LOCAL idle_in_transaction_session_timeout = 0"); err != nil {
		t.Fatal(err)
	}
	la.extend(time.Now(), time.Hour)
	if err := a.fence(ctx, tx, la); err != nil {
		t.Fatal(err)
	}
	acquired := make(chan time.Time, 1)
	go func() {
		if _, err := b.acquire(ctx, leaseConnFor(t, b).conn); err != nil {
			t.Error(err)
		}
		acquired <- time.Now()
	}()
	time.Sleep(3 * length) // deliberate pause: three lease lengths in which the takeover must not commit (a negative check)
	select {
	case <-acquired:
		t.Fatal("the takeover committed while an acknowledgement of the old epoch ran")
	default:
	}
	committed := time.Now()
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("the running acknowledgement: %v", err)
	}
	if at := <-acquired; at.Before(committed) {
		t.Fatal("the takeover finished before the acknowledgement committed")
	}
	if err := ackFenced(ctx, a, la); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("an acknowledgement of the old epoch after the takeover: %v", err)
	}
}

// TestReleasedLeaseIsTakenAtOnce: after a clean stop the standby does not
// wait for the lease to run out.
func TestReleasedLeaseIsTakenAtOnce(t *testing.T) {
	ctx := context.Background()
	const length = 10 * time.Second
	a, ac, la, b := leaderAndStandby(t, length)
	a.release(ctx, ac, la)
	start := time.Now()
	lb, err := b.acquire(ctx, leaseConnFor(t, b).conn)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > length/2 {
		t.Fatalf("took a released lease after %v", took)
	}
	if lb.epoch != la.epoch+1 {
		t.Fatalf("epochs: old %d, new %d", la.epoch, lb.epoch)
	}
}
