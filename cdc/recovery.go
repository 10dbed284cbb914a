package cdc

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/relay/relay"
	"github.com/outboxrelay/relay/relay/store"
)

// marker is the slot's row in <schema>.cdc_slots: the consistent point and
// snapshot of its creation. Rows visible in that snapshot committed before
// the slot's first decoded transaction, so they are read from the table.
// The row has three states: no position (a creation in progress, or
// interrupted), position and snapshot (table rows still to publish),
// position only (done). It is kept when done, so that a slot without a row
// is known not to have been created by the relay.
type marker struct {
	exists   bool
	lsn      pglogrepl.LSN
	snapshot string
}

func (m marker) creating() bool { return m.exists && m.lsn == 0 }

func (m marker) pending() bool { return m.exists && m.lsn != 0 && m.snapshot != "" }

func (s *Source) readMarker(ctx context.Context, db store.DB) (marker, error) {
	row, found, err := s.q.Mark(ctx, db, s.slotName())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return marker{}, &permanentError{fmt.Errorf("cdc: %s is missing; run `relay migrate up --schema %s`: %w", s.slotsTbl, s.cfg.Schema, err)}
	}
	if err != nil {
		return marker{}, fmt.Errorf("cdc: reading %s: %w", s.slotsTbl, err)
	}
	if !found {
		return marker{}, nil
	}
	mk := marker{exists: true, snapshot: row.Snapshot}
	if row.ConsistentLSN != "" {
		if mk.lsn, err = pglogrepl.ParseLSN(row.ConsistentLSN); err != nil {
			return marker{}, fmt.Errorf("cdc: %s: %w", s.slotsTbl, err)
		}
	}
	return mk, nil
}

// createSlot (re)creates the slot and records the consistent point and
// snapshot of its creation.
//
// The record is written in two steps: first without a position (a
// creation in progress), then, once the slot exists, with its consistent
// point and snapshot. A crash between the two leaves the first form, and
// the next Start creates the slot again: a slot is never used without a
// record of which table rows it will not stream.
func (s *Source) createSlot(ctx context.Context, conn *pgx.Conn, st slotState) (marker, error) {
	name := s.slotName()
	if !st.exists {
		if err := s.checkFreeSlot(ctx, conn); err != nil {
			return marker{}, err
		}
	}
	if err := s.q.BeginMark(ctx, conn, name); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
			return marker{}, fmt.Errorf("cdc: %s is missing; run `relay migrate up --schema %s`: %w", s.slotsTbl, s.cfg.Schema, err)
		}
		return marker{}, fmt.Errorf("cdc: recording the slot creation: %w", err)
	}
	if st.exists {
		if err := s.q.DropSlot(ctx, conn, name); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "55006" {
				return marker{}, &SlotActiveError{Slot: name, PID: st.activePID}
			}
			if !(errors.As(err, &pgErr) && pgErr.Code == "42704") {
				return marker{}, fmt.Errorf("cdc: dropping the invalidated slot %q: %w", name, err)
			}
		}
	}

	repl, err := s.connectReplication(ctx, nil)
	if err != nil {
		return marker{}, err
	}
	defer repl.Close(context.WithoutCancel(ctx))
	failover := !s.cfg.NoFailoverSlot && serverMajor(repl.ParameterStatus("server_version")) >= 17
	var res pglogrepl.CreateReplicationSlotResult
	if failover {
		// The option list syntax (PostgreSQL 15 and later) is the only
		// one that takes FAILOVER (17 and later).
		res, err = pglogrepl.ParseCreateReplicationSlot(repl.Exec(ctx,
			"CREATE_REPLICATION_SLOT "+name+" LOGICAL pgoutput (SNAPSHOT 'export', FAILOVER true)"))
	} else {
		res, err = pglogrepl.CreateReplicationSlot(ctx, repl, name, "pgoutput", pglogrepl.CreateReplicationSlotOptions{
			Mode:           pglogrepl.LogicalReplication,
			SnapshotAction: "EXPORT_SNAPSHOT",
		})
	}
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "53400" {
			used, limit, _ := s.q.SlotCount(ctx, conn)
			return marker{}, noFreeSlot(used, limit)
		}
		return marker{}, fmt.Errorf("cdc: creating replication slot %q: %w", name, err)
	}
	lsn, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return marker{}, fmt.Errorf("cdc: slot %q: %w", name, err)
	}
	// The exported snapshot lives until the replication connection runs
	// another command; import it to learn its xmin, xmax and running
	// transactions, which pg_visible_in_snapshot can test rows against
	// from then on, on any connection.
	var snapshot string
	err = pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		snapshot, err = s.q.ImportSnapshot(ctx, tx, res.SnapshotName)
		return err
	})
	if err != nil {
		return marker{}, fmt.Errorf("cdc: importing the snapshot of slot %q: %w", name, err)
	}
	snapshot = normalizeSnapshot(snapshot)
	if err := s.q.CompleteMark(ctx, conn, name, lsn.String(), snapshot); err != nil {
		return marker{}, fmt.Errorf("cdc: recording the slot creation: %w", err)
	}
	s.log.Info("created the replication slot", "consistent_point", lsn.String(), "snapshot", snapshot, "failover", failover)
	return marker{exists: true, lsn: lsn, snapshot: snapshot}, nil
}

// readTable queues the outbox rows that committed before the slot's
// consistent point, in (txid, id) order, at positions (consistent point -
// 1, n): after everything the old slot delivered, before everything the
// new slot streams.
func (r *reader) readTable(ctx context.Context) error {
	s := r.s
	mk := r.marker
	major := uint64(mk.lsn) - 1
	pool := r.pool
	if major < r.skipBelow.Major {
		// Published beyond this slot's table rows: they are all gone
		// unless the checkpoint belongs to another database.
		left, err := s.q.RowsLeft(ctx, pool, mk.snapshot)
		if err != nil {
			return fmt.Errorf("cdc: reading the outbox table: %w", err)
		}
		if left {
			return &permanentError{fmt.Errorf("cdc: the last published position %s is beyond the consistent point %s of slot %q, yet rows from before it remain; the checkpoint does not belong to this database or slot",
				r.skipBelow, mk.lsn, s.slotName())}
		}
		s.mu.Lock()
		select {
		case s.markerDone <- mk.lsn:
		default:
		}
		s.mu.Unlock()
		r.marker = marker{}
		return nil
	}
	s.mu.Lock()
	s.inTx = true
	s.mu.Unlock()
	if r.tableTxid == "" {
		r.tableTxid, r.tableID = "0", 0
	}
	total := 0
	started := time.Now()
	for {
		page, err := s.q.ReadTablePage(ctx, pool, mk.snapshot, r.tableTxid, r.tableID)
		if err != nil {
			return fmt.Errorf("cdc: reading the outbox table: %w", err)
		}
		for _, row := range page {
			e := relay.Event{ID: row.ID, EventID: row.EventID, Topic: row.Topic, Key: row.Key, Payload: row.Payload,
				Headers: row.Headers, CreatedAt: row.CreatedAt}
			if err := r.queueTableRow(ctx, e, row.Txid, major); err != nil {
				return err
			}
			total++
		}
		if len(page) < store.CDCTablePage {
			break
		}
	}

	s.mu.Lock()
	if s.open != nil {
		s.closeOpenLocked()
	}
	if r.skipBelow.Major == major {
		s.txs = append(s.txs, txMark{major: major, last: r.skipBelow.Minor, end: mk.lsn, marker: true})
	} else {
		select {
		case s.markerDone <- mk.lsn:
		default:
		}
	}
	r.lastMajor = major
	s.inTx = false
	s.advanceLocked()
	s.notifyLocked()
	s.mu.Unlock()
	r.marker, r.tableTxid, r.tableID = marker{}, "", 0
	if total > 0 {
		s.log.Warn("queued the unpublished outbox rows from the table", "rows", total, "took", time.Since(started).Round(time.Millisecond))
	}
	return nil
}

// queueTableRow queues one row read from the table, waiting for room.
func (r *reader) queueTableRow(ctx context.Context, e relay.Event, txid string, major uint64) error {
	s := r.s
	next := uint64(0)
	if r.skipBelow.Major == major {
		next = r.skipBelow.Minor + 1
	}
	e.Position = relay.Position{Major: major, Minor: next}
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.fullLocked() {
		if err := s.waitLocked(ctx); err != nil {
			return err
		}
	}
	// One chunk per writing transaction, so Next keeps them whole.
	if s.open != nil && txid != r.tableTxid {
		s.closeOpenLocked()
		s.notifyLocked()
	}
	s.pushLocked(e)
	r.skipBelow = e.Position
	r.tableTxid, r.tableID = txid, e.ID
	return nil
}

// recoverSlot replaces a slot that was dropped or invalidated while
// streaming. It drops the queued events, waits until the core has
// acknowledged everything already delivered (so the table then holds
// exactly the events still to publish), and creates the slot again; the
// next session reads the table first.
func (r *reader) recoverSlot(ctx context.Context) error {
	s := r.s
	how := "dropped"
	if st, err := s.readSlot(ctx, r.pool, s.slotName()); err == nil && st.lost() {
		how = "invalidated by the server (wal_status = lost, max_slot_wal_keep_size exceeded)"
	}
	s.log.Error("REPLICATION SLOT LOST while streaming: it was "+how+"; waiting for in-flight events to be acknowledged, then recreating it and publishing every unpublished outbox row from the table",
		"publication", s.cfg.PublicationName)
	s.mu.Lock()
	s.queue, s.open, s.queued, s.queuedBytes, s.txs, s.inTx = nil, nil, 0, 0, nil, true
	for s.acked.Less(s.delivered) {
		if err := s.waitLocked(ctx); err != nil {
			s.mu.Unlock()
			return err
		}
	}
	from := s.acked
	s.mu.Unlock()

	conn, st, err := s.slotConn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if st.exists && st.activePID != 0 {
		return &SlotActiveError{Slot: s.slotName(), PID: st.activePID}
	}
	mk, err := s.createSlot(ctx, conn, st)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.flush, s.serverEnd = mk.lsn, 0
	s.mu.Unlock()
	r.marker, r.skipBelow, r.tableTxid, r.tableID = mk, from, "", 0
	return nil
}

// normalizeSnapshot rewrites a snapshot whose xmin is above its xmax,
// which the snapshot of a new logical slot can be and which pg_snapshot's
// input refuses. Such a snapshot shows exactly the transactions below
// xmin (every one below xmin is finished and visible; nothing between is
// in progress), which "xmin:xmin:" says in a form Postgres accepts.
func normalizeSnapshot(snap string) string {
	parts := strings.SplitN(snap, ":", 3)
	if len(parts) != 3 {
		return snap
	}
	xmin, err1 := strconv.ParseUint(parts[0], 10, 64)
	xmax, err2 := strconv.ParseUint(parts[1], 10, 64)
	if err1 != nil || err2 != nil || xmin <= xmax {
		return snap
	}
	return parts[0] + ":" + parts[0] + ":"
}
