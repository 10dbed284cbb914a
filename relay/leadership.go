package relay

// Leadership: one leader per outbox, fenced by an epoch and bounded by a
// lease.
//
// # How it works
//
//   - <schema>.leadership holds the epoch of the current leader;
//     <schema>.leader_lease holds that epoch again, a renewal counter and
//     the lease length (migration 006).
//   - A leader renews every Lease/6: it increments renewals where the epoch
//     is still its own. Its lease deadline is the moment it sent the last
//     successful renewal plus Lease*4/5, on its own monotonic clock. Past
//     the deadline it appends nothing (the sinks check Fence before every
//     append) and its pipeline is cancelled.
//   - A standby polls the lease row. When it sees (epoch, renewals)
//     unchanged for a whole lease_ms of its own monotonic clock, or the row
//     released by a leader that stopped cleanly, it takes over in one
//     transaction: it increments the epoch in leadership (waiting for any
//     acknowledgement still running, which holds that row FOR SHARE), and
//     swaps the lease row only if (epoch, renewals) are still what it saw.
//   - Every acknowledgement transaction starts with SELECT ... FOR SHARE of
//     the leadership row where the epoch is its own; it aborts with
//     ErrNotLeader when the row has moved on.
//
// # Fault model
//
//   - Leader killed: its renewals stop; a standby takes over after one
//     lease (plus one poll), reads the checkpoint after its takeover
//     committed, and the sink deduplicates by event id what the dead leader
//     appended without acknowledging.
//   - Leader alive but its lease connection killed, or the network to
//     Postgres silent (a partition): renewals fail or hang; the leader's
//     deadline passes at most Lease*4/5 after its last successful renewal
//     was sent, and the standby's takeover comes at least Lease after that
//     renewal committed. So the old leader stops appending at least
//     Lease/5 before the new one can start. Its acknowledgements are refused
//     by the epoch check even if its connections come back.
//   - Leader paused (SIGSTOP, a VM freeze) past its lease: when it resumes,
//     its deadline has passed on the monotonic clock (which runs while a
//     process is stopped), so Fence fails before any append, and any
//     acknowledgement is refused by the epoch. A transaction it left open
//     is ended by idle_in_transaction_session_timeout (set to the lease on
//     the relay's connections), so the takeover does not wait for it.
//   - Clock steps: no wall clock is compared across machines. Both sides
//     measure durations on their own monotonic clocks; only the rates must
//     agree, which NTP-slewed clocks do to a few hundred parts per million.
//   - Operator edits to the tables: bumping the epoch by hand deposes the
//     leader (safe); deleting the rows makes every acknowledgement fail
//     with ErrNotLeader until `relay migrate` state is restored.
//
// The tests in leadership_test.go and the end-to-end tests in
// internal/faults (lease sessions killed, a silent TCP partition through a
// proxy, SIGSTOP, connections cut) show these.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/pgconfig"
)

// ErrNotLeader is returned once this relay may no longer be the leader: its
// lease ran out or a newer epoch was elected.
var ErrNotLeader = errors.New("no longer the leader")

// leaseObservation is what a standby last saw of the lease row, and when
// (on its monotonic clock) it first saw it.
type leaseObservation struct {
	epoch, renewals int64
	released        bool
	lease           time.Duration
	since           time.Time
}

// lease is leadership held: the epoch it was elected with and the deadline
// past which it must not act.
type lease struct {
	epoch int64

	mu       sync.Mutex
	deadline time.Time
}

// Fence returns nil while the lease is held, else ErrNotLeader. Sinks call
// it before every append.
func (l *lease) Fence() error {
	l.mu.Lock()
	d := l.deadline
	l.mu.Unlock()
	if !time.Now().Before(d) {
		return fmt.Errorf("%w: lease of epoch %d expired", ErrNotLeader, l.epoch)
	}
	return nil
}

func (l *lease) extend(sent time.Time, length time.Duration) {
	l.mu.Lock()
	if d := sent.Add(trustedPart(length)); d.After(l.deadline) {
		l.deadline = d
	}
	l.mu.Unlock()
}

func (l *lease) remaining() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Until(l.deadline)
}

// trustedPart is how long after sending a renewal the leader trusts it:
// four fifths of the lease, so that it stops at least a fifth of a lease
// before any standby may take over.
func trustedPart(length time.Duration) time.Duration { return length * 4 / 5 }

func renewInterval(length time.Duration) time.Duration { return length / 6 }

func holderName() string {
	host, _ := os.Hostname()
	return host + "/" + strconv.Itoa(os.Getpid()) + "/" + uuid.NewString()[:8]
}

// acquire waits as a standby until this relay takes the leadership, and
// returns the lease. conn is the lease connection.
func (r *Relay) acquire(ctx context.Context, conn *pgx.Conn) (*lease, error) {
	var seen leaseObservation
	announced, toldSink := false, false
	poll := min(max(r.cfg.Lease/10, 10*time.Millisecond), 250*time.Millisecond)
	for {
		row, err := r.store.ObserveLease(ctx, conn)
		if err != nil {
			return nil, fmt.Errorf("reading the leader lease: %w", err)
		}
		o := leaseObservation{epoch: row.Epoch, renewals: row.Renewals, released: row.Released,
			lease: time.Duration(row.LeaseMS) * time.Millisecond}
		if s, ok := r.sink.(StandbySink); ok && !toldSink && o.epoch != r.ledEpoch {
			// Epochs move only by takeovers: another relay has led since
			// this one did.
			toldSink = true
			s.Standby()
		}
		now := time.Now()
		if o.epoch != seen.epoch || o.renewals != seen.renewals || o.released != seen.released || seen.since.IsZero() {
			o.since = now
			seen = o
		}
		if seen.released || now.Sub(seen.since) >= seen.lease {
			l, err := r.takeOver(ctx, conn, seen)
			if err != nil {
				return nil, err
			}
			if l != nil {
				return l, nil
			}
			seen = leaseObservation{}
			continue
		}
		if !announced {
			announced = true
			r.role.Store(RoleStandby)
			r.log.Info("another relay is the leader; waiting as standby", "schema", r.cfg.Schema, "epoch", seen.epoch)
		}
		if err := sleepCtx(ctx, poll); err != nil {
			return nil, err
		}
	}
}

// takeOver increments the epoch and swaps the lease row if it is still as
// seen; it returns nil when another relay moved first.
func (r *Relay) takeOver(ctx context.Context, conn *pgx.Conn, seen leaseObservation) (*lease, error) {
	sent := time.Now()
	var l *lease
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		l = nil
		epoch, err := r.store.LockEpoch(ctx, tx)
		if err != nil {
			return err
		}
		if epoch != seen.epoch {
			return nil
		}
		if epoch, err = r.store.BumpEpoch(ctx, tx, epoch, r.holder); err != nil {
			return err
		}
		swapped, err := r.store.SwapLease(ctx, tx, seen.epoch, seen.renewals, epoch, r.cfg.Lease.Milliseconds())
		if err != nil {
			return err
		}
		if !swapped {
			return errRetryTakeover
		}
		l = &lease{epoch: epoch}
		return nil
	})
	if errors.Is(err, errRetryTakeover) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("taking over the leadership: %w", err)
	}
	if l != nil {
		l.extend(sent, r.cfg.Lease)
	}
	return l, nil
}

var errRetryTakeover = errors.New("the lease moved")

// Application names the relay's Postgres sessions carry, so operators (and
// the fault tests) can tell them apart in pg_stat_activity.
const (
	ApplicationName      = "relay"
	LeaseApplicationName = "relay leader lease"
)

// leaseConn is the lease's own connection, opened again when it breaks.
type leaseConn struct {
	r    *Relay
	conn *pgx.Conn
}

func (c *leaseConn) get(ctx context.Context) (*pgx.Conn, error) {
	if c.conn != nil && !c.conn.IsClosed() {
		return c.conn, nil
	}
	c.close(ctx)
	conn, err := pgconfig.ConnectWith(ctx, c.r.cfg.DatabaseURL, func(cfg *pgx.ConnConfig) {
		cfg.RuntimeParams["application_name"] = LeaseApplicationName
	})
	if err != nil {
		return nil, err
	}
	c.conn = conn
	return conn, nil
}

func (c *leaseConn) close(ctx context.Context) {
	if c.conn != nil {
		c.conn.Close(ctx)
		c.conn = nil
	}
}

// keepLease renews l until ctx ends or the lease is lost, then returns why
// it was lost (nil when ctx ended first). A broken connection is opened
// again; the lease survives that if a renewal succeeds within its trusted
// part.
func (r *Relay) keepLease(ctx context.Context, lc *leaseConn, l *lease) error {
	t := time.NewTicker(renewInterval(r.cfg.Lease))
	defer t.Stop()
	expiry := time.NewTimer(l.remaining())
	defer expiry.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-expiry.C:
			if l.remaining() <= 0 {
				return fmt.Errorf("%w: the lease of epoch %d ran out before it could be renewed", ErrNotLeader, l.epoch)
			}
			expiry.Reset(l.remaining())
			continue
		case <-t.C:
		}
		sent := time.Now()
		rctx, cancel := context.WithTimeout(ctx, max(l.remaining(), time.Millisecond))
		renewed, err := r.renew(rctx, lc, l)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			r.m.Errors.WithLabelValues("leader").Inc()
			if l.remaining() <= 0 {
				return fmt.Errorf("%w: renewing the lease of epoch %d: %w", ErrNotLeader, l.epoch, err)
			}
			r.log.Warn("renewing the leader lease failed; retrying", "epoch", l.epoch, "err", err, "trusted_for", l.remaining().Round(time.Millisecond))
			continue
		}
		if !renewed {
			return fmt.Errorf("%w: epoch %d was superseded", ErrNotLeader, l.epoch)
		}
		l.extend(sent, r.cfg.Lease)
		expiry.Reset(l.remaining())
	}
}

func (r *Relay) renew(ctx context.Context, lc *leaseConn, l *lease) (bool, error) {
	conn, err := lc.get(ctx)
	if err != nil {
		return false, err
	}
	return r.store.RenewLease(ctx, conn, l.epoch)
}

// release hands the leadership over at once after a clean stop.
func (r *Relay) release(ctx context.Context, lc *leaseConn, l *lease) {
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	conn, err := lc.get(rctx)
	if err == nil {
		err = r.store.ReleaseLease(rctx, conn, l.epoch)
	}
	if err != nil {
		r.log.Warn("releasing the leader lease failed; a standby takes over when it expires", "err", err)
	}
}

// fence checks, inside an acknowledgement transaction, that epoch still
// leads, and holds the leadership row so that no takeover commits before
// this transaction does.
func (r *Relay) fence(ctx context.Context, tx pgx.Tx, l *lease) error {
	if err := l.Fence(); err != nil {
		return err
	}
	held, err := r.store.Fence(ctx, tx, l.epoch)
	if err != nil {
		return err
	}
	if !held {
		return fmt.Errorf("%w: epoch %d was superseded", ErrNotLeader, l.epoch)
	}
	return nil
}
