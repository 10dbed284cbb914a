package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// leaseSQL are the statements of leadership (relay/leadership.go).
type leaseSQL struct {
	observe, lockEpoch, bump, swap, renew, release, fence string
}

func newLeaseSQL(ident func(string) string) leaseSQL {
	leadership, lease := ident("leadership"), ident("leader_lease")
	return leaseSQL{
		observe:   `SELECT epoch, renewals, released, lease_ms FROM ` + lease,
		lockEpoch: `SELECT epoch FROM ` + leadership + ` FOR UPDATE`,
		bump:      `UPDATE ` + leadership + ` SET epoch = epoch + 1, holder = $2, since = now() WHERE epoch = $1 RETURNING epoch`,
		swap: `UPDATE ` + lease + ` SET epoch = $3, renewals = 0, lease_ms = $4, released = false, renewed_at = now()
WHERE epoch = $1 AND renewals = $2`,
		renew:   `UPDATE ` + lease + ` SET renewals = renewals + 1, renewed_at = now() WHERE epoch = $1 AND NOT released`,
		release: `UPDATE ` + lease + ` SET released = true, renewed_at = now() WHERE epoch = $1`,
		// The fenced transaction may delete outbox rows, which migration
		// 011's trigger refuses to everyone else.
		fence: `SELECT 1 FROM ` + leadership + ` WHERE epoch = $1 AND set_config('relay.allow_outbox_changes', 'on', true) = 'on' FOR SHARE`,
	}
}

// Lease is the lease row as a standby sees it.
type Lease struct {
	Epoch, Renewals int64
	Released        bool
	LeaseMS         int64
}

// ObserveLease reads the lease row.
func (p *Postgres) ObserveLease(ctx context.Context, db DB) (Lease, error) {
	var l Lease
	err := db.QueryRow(ctx, p.lease.observe).Scan(&l.Epoch, &l.Renewals, &l.Released, &l.LeaseMS)
	return l, err
}

// LockEpoch reads the leadership's epoch and locks its row until tx ends
// (waiting for acknowledgements that hold it FOR SHARE).
func (p *Postgres) LockEpoch(ctx context.Context, tx DB) (int64, error) {
	var epoch int64
	err := tx.QueryRow(ctx, p.lease.lockEpoch).Scan(&epoch)
	return epoch, err
}

// BumpEpoch increments the leadership's epoch from epoch, naming holder,
// and returns the new epoch. It fails with pgx.ErrNoRows when the epoch
// is no longer epoch.
func (p *Postgres) BumpEpoch(ctx context.Context, tx DB, epoch int64, holder string) (int64, error) {
	err := tx.QueryRow(ctx, p.lease.bump, epoch, holder).Scan(&epoch)
	return epoch, err
}

// SwapLease gives the lease row to epoch, with a lease of leaseMS, if its
// (epoch, renewals) are still (seenEpoch, seenRenewals); it reports
// whether they were.
func (p *Postgres) SwapLease(ctx context.Context, tx DB, seenEpoch, seenRenewals, epoch, leaseMS int64) (bool, error) {
	tag, err := tx.Exec(ctx, p.lease.swap, seenEpoch, seenRenewals, epoch, leaseMS)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

// RenewLease counts a renewal of epoch's lease; it reports false when the
// lease is no longer epoch's (or was released).
func (p *Postgres) RenewLease(ctx context.Context, db DB, epoch int64) (bool, error) {
	tag, err := db.Exec(ctx, p.lease.renew, epoch)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

// ReleaseLease marks epoch's lease released, so that a standby takes over
// at once.
func (p *Postgres) ReleaseLease(ctx context.Context, db DB, epoch int64) error {
	_, err := db.Exec(ctx, p.lease.release, epoch)
	return err
}

// Fence holds the leadership row FOR SHARE until tx ends if epoch still
// leads, and lets tx change outbox rows; it reports false when another
// epoch leads.
func (p *Postgres) Fence(ctx context.Context, tx DB, epoch int64) (bool, error) {
	var one int
	err := tx.QueryRow(ctx, p.lease.fence, epoch).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}
