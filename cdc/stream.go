package cdc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/internal/pgconfig"
	"github.com/outboxrelay/relay/relay"
)

// receiveTimeout bounds one wait for a replication message, so that an
// acknowledgement reaches the server promptly even when the stream is
// quiet.
const receiveTimeout = 100 * time.Millisecond

// errSlotLost means the slot was dropped or invalidated.
var errSlotLost = errors.New("cdc: the replication slot is gone")

// permanentError is a failure that retrying cannot fix.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// reader is the background goroutine's state: it reads the table after a
// slot was (re)created, then streams, reconnecting until the source
// closes.
type reader struct {
	s    *Source
	pool *pgxpool.Pool
	// skipBelow is the position of the last event queued (Start's from at
	// first): anything at or before it is already delivered.
	skipBelow relay.Position
	// lastMajor is the commit LSN of the last transaction added to s.txs.
	lastMajor uint64
	// marker, when pending, is a slot creation whose table rows are still to
	// be queued.
	marker marker
	// table cursor (txid, id) of the table read in progress.
	tableTxid string
	tableID   int64

	decode *decoder
	rels   map[uint32]*relation
	// prefix is that of the emit_message messages of this outbox.
	prefix  string
	txMajor uint64
	txIndex uint64
	// txCommitted is the commit time of the transaction being received.
	txCommitted time.Time
}

func (r *reader) run(ctx context.Context) {
	s := r.s
	var backoff time.Duration
	var busySince time.Time
	for ctx.Err() == nil {
		err := r.session(ctx, &backoff)
		if ctx.Err() != nil {
			return
		}
		backoff = min(max(2*backoff, 100*time.Millisecond), s.cfg.MaxBackoff)
		var perm *permanentError
		switch {
		case errors.As(err, &perm):
			s.log.Error("the replication stream failed and cannot recover on its own", "err", err)
			s.fail(err)
			return
		case errors.Is(err, errSlotLost):
			busySince = time.Time{}
			if err := r.recoverSlot(ctx); err == nil {
				backoff = 0
				continue
			} else if errors.As(err, &perm) || errors.Is(err, ErrNoFreeSlot) {
				s.fail(err)
				return
			} else if ctx.Err() != nil {
				return
			} else {
				s.log.Error("recreating the replication slot failed; retrying", "err", err)
			}
		case errors.Is(err, ErrSlotActive):
			if busySince.IsZero() {
				busySince = time.Now()
			} else if time.Since(busySince) > s.cfg.SlotBusyTimeout {
				s.fail(err)
				return
			}
			s.log.Warn("the replication slot is still held by another process; retrying", "err", err)
		default:
			busySince = time.Time{}
			s.log.Warn("the replication stream stopped; reconnecting", "err", err, "retry_in", backoff)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
	}
}

// session reads the pending table rows, if any, then streams until an
// error. backoff is reset once streaming started.
func (r *reader) session(ctx context.Context, backoff *time.Duration) error {
	s := r.s
	if r.marker.pending() {
		if err := r.readTable(ctx); err != nil {
			return err
		}
	}
	pool := r.pool
	st, err := readSlot(ctx, pool, s.slotName())
	if err != nil {
		return err
	}
	if !st.exists || st.lost() {
		return errSlotLost
	}
	// A slot whose creation was not recorded whole (a re-creation that
	// failed half way) cannot say which rows to read from the table:
	// replace it rather than stream from it.
	if mk, err := s.readMarker(ctx, pool); err != nil {
		return err
	} else if !mk.exists || mk.creating() {
		return errSlotLost
	}
	if err := st.usable(s.slotName(), s.database); err != nil {
		if errors.Is(err, ErrSlotMismatch) {
			return &permanentError{err}
		}
		return err
	}
	conn, err := s.connectReplication(ctx)
	if err != nil {
		return err
	}
	defer func() {
		pid := int32(conn.PID())
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		conn.Close(closeCtx)
		if ctx.Err() != nil {
			awaitRelease(closeCtx, pool, s.slotName(), pid)
		}
	}()
	s.mu.Lock()
	s.flush = max(s.flush, st.confirmed)
	s.mu.Unlock()
	args := []string{
		"proto_version '1'",
		"publication_names '" + s.cfg.PublicationName + "'",
		"messages 'true'",
	}
	if !s.textTuples && binaryTuples(conn.ParameterStatus("server_version")) {
		args = append(args, "binary 'true'")
	}
	err = pglogrepl.StartReplication(ctx, conn, s.slotName(), 0, pglogrepl.StartReplicationOptions{
		Mode:       pglogrepl.LogicalReplication,
		PluginArgs: args,
	})
	if err != nil {
		if st, serr := readSlot(ctx, pool, s.slotName()); serr == nil && (!st.exists || st.lost()) {
			return errSlotLost
		}
		return fmt.Errorf("cdc: starting replication from slot %q: %w", s.slotName(), err)
	}
	*backoff = 0
	r.rels = map[uint32]*relation{}
	s.log.Info("streaming from the replication slot", "after", r.skipBelow.String())
	return r.stream(ctx, conn)
}

// binaryTuples reports whether pgoutput can send values in binary format
// (PostgreSQL 14 and later): the walsender then skips the output functions
// (hex for bytea, date formatting for timestamps) of every type that has a
// send function, and sends bytea at half the size. Types without one still
// come as text, which the decoder reads too. serverVersion is the
// server_version the connection reported, say "15.18 (Debian ...)".
func binaryTuples(serverVersion string) bool {
	end := 0
	for end < len(serverVersion) && isDigit(serverVersion[end]) {
		end++
	}
	major, err := strconv.Atoi(serverVersion[:end])
	return err == nil && major >= 14
}

// awaitRelease waits until the walsender pid no longer holds the slot, so
// that a Start right after Close finds it free.
func awaitRelease(ctx context.Context, pool *pgxpool.Pool, slot string, pid int32) {
	for {
		st, err := readSlot(ctx, pool, slot)
		if err != nil || st.activePID != pid {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stream reads replication messages until an error, replying to the
// server's keepalives and reporting the flush position.
func (r *reader) stream(ctx context.Context, conn *pgconn.PgConn) error {
	s := r.s
	st := &statusSender{conn: conn, interval: s.cfg.StatusInterval}
	// Waits for messages are bounded by a read deadline on the socket,
	// renewed when it passes, rather than by a context per message: a
	// context makes pgconn watch it with a goroutine and reset the
	// deadline on every message, which cost more than decoding at
	// hundreds of thousands of messages a second. Messages already
	// buffered are read without touching the socket.
	netConn := conn.Conn()
	defer netConn.SetReadDeadline(time.Time{})
	wait := min(receiveTimeout, s.cfg.StatusInterval)
	var deadline time.Time
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := r.waitForRoom(ctx, st); err != nil {
			return err
		}
		if err := st.send(ctx, s, false); err != nil {
			return err
		}
		if now := time.Now(); now.After(deadline) {
			deadline = now.Add(wait)
			if err := netConn.SetReadDeadline(deadline); err != nil {
				return fmt.Errorf("cdc: setting the replication stream's read deadline: %w", err)
			}
		}
		raw, err := conn.ReceiveMessage(context.Background())
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if pgconn.Timeout(err) && !conn.IsClosed() {
				deadline = time.Time{}
				continue
			}
			return fmt.Errorf("cdc: receiving from the replication stream: %w", err)
		}
		switch m := raw.(type) {
		case *pgproto3.CopyData:
			if len(m.Data) == 0 {
				continue
			}
			switch m.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(m.Data[1:])
				if err != nil {
					return fmt.Errorf("cdc: %w", err)
				}
				s.mu.Lock()
				s.serverEnd = max(s.serverEnd, ka.ServerWALEnd)
				s.advanceLocked()
				s.mu.Unlock()
				if ka.ReplyRequested {
					if err := st.send(ctx, s, true); err != nil {
						return err
					}
				}
			case pglogrepl.XLogDataByteID:
				xld, err := pglogrepl.ParseXLogData(m.Data[1:])
				if err != nil {
					return fmt.Errorf("cdc: %w", err)
				}
				if err := r.handle(xld.WALData); err != nil {
					return err
				}
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("cdc: replication stream: %w", pgconn.ErrorResponseToPgError(m))
		case *pgproto3.CopyDone:
			return errors.New("cdc: the server ended the replication stream")
		}
	}
}

// handle applies one pgoutput message.
func (r *reader) handle(data []byte) error {
	s := r.s
	if relID, ok := insertRelationID(data); ok {
		return r.insert(relID, data)
	}
	if len(data) == 0 {
		return &permanentError{errors.New("cdc: an empty pgoutput message")}
	}
	msg, err := pglogrepl.Parse(data)
	if err != nil {
		return &permanentError{fmt.Errorf("cdc: decoding a pgoutput message: %w", err)}
	}
	switch m := msg.(type) {
	case *pglogrepl.RelationMessage:
		rel, err := newRelation(m, s.cfg.Schema)
		if err != nil {
			return &permanentError{err}
		}
		r.rels[m.RelationID] = rel
	case *pglogrepl.BeginMessage:
		r.txMajor, r.txIndex, r.txCommitted = uint64(m.FinalLSN), 0, m.CommitTime
		s.mu.Lock()
		s.inTx = true
		s.mu.Unlock()
	case *pglogrepl.CommitMessage:
		s.mu.Lock()
		if s.open != nil && s.open.major == r.txMajor {
			s.closeOpenLocked()
		}
		if r.txMajor > r.lastMajor {
			s.txs = append(s.txs, txMark{major: r.txMajor, last: r.txIndex - 1, empty: r.txIndex == 0, end: m.TransactionEndLSN})
			r.lastMajor = r.txMajor
		}
		s.inTx = false
		s.advanceLocked()
		s.notifyLocked()
		s.mu.Unlock()
	case *pglogrepl.LogicalDecodingMessage:
		if !m.Transactional {
			s.mu.Lock()
			s.serverEnd = max(s.serverEnd, m.LSN)
			s.advanceLocked()
			s.mu.Unlock()
			return nil
		}
		if m.Prefix == r.prefix {
			r.message(m)
		}
	}
	return nil
}

// message queues the event of an emit_message message (message.go), if
// not delivered yet. It takes the next position of its transaction, as an
// insert does, so messages and inserts keep their order.
func (r *reader) message(m *pglogrepl.LogicalDecodingMessage) {
	pos := relay.Position{Major: r.txMajor, Minor: r.txIndex}
	r.txIndex++
	if !r.skipBelow.Less(pos) {
		return
	}
	e := messageEvent(m)
	if e.CreatedAt.IsZero() {
		e.CreatedAt = r.txCommitted
	}
	e.Position = pos
	e.CommittedAt = r.txCommitted
	s := r.s
	s.mu.Lock()
	s.pushLocked(e)
	s.mu.Unlock()
	r.skipBelow = pos
}

// insert queues the event of an Insert message, if it is an insert into
// the outbox not delivered yet.
func (r *reader) insert(relID uint32, data []byte) error {
	rel, ok := r.rels[relID]
	if !ok {
		return &permanentError{fmt.Errorf("cdc: insert into relation %d before its relation message", relID)}
	}
	if !rel.outbox {
		return nil
	}
	pos := relay.Position{Major: r.txMajor, Minor: r.txIndex}
	r.txIndex++
	if !r.skipBelow.Less(pos) {
		return nil
	}
	e, err := r.decode.insert(rel, data)
	if err != nil {
		return &permanentError{err}
	}
	e.Position = pos
	e.CommittedAt = r.txCommitted
	s := r.s
	s.mu.Lock()
	s.pushLocked(e)
	s.mu.Unlock()
	r.skipBelow = pos
	return nil
}

// pushLocked queues e in the chunk of its transaction.
func (s *Source) pushLocked(e relay.Event) {
	if s.open == nil || s.open.major != e.Position.Major {
		// Transactions tend to be alike: start at the size of the last
		// one rather than grow from nothing, copying events each time.
		s.open = &chunk{major: e.Position.Major, events: make([]relay.Event, 0, max(s.chunkHint, 1))}
		s.queue = append(s.queue, s.open)
	}
	s.open.events = append(s.open.events, e)
	s.queued++
	s.queuedBytes += eventBytes(e)
	// A transaction still arriving can be taken only in pieces of Next's
	// max, or when the queue is full; waking Next for every event would
	// cost a wake-up per event. The commit wakes it for the rest.
	if len(s.open.events)%wakeEvery == 0 || s.fullLocked() {
		s.notifyLocked()
	}
}

// closeOpenLocked marks the chunk of the transaction being received as
// whole.
func (s *Source) closeOpenLocked() {
	s.chunkHint = min(len(s.open.events), maxChunkHint)
	s.open.closed = true
	s.open = nil
}

// maxChunkHint caps the room a transaction's chunk starts with.
const maxChunkHint = 4096

// wakeEvery is how many events of a transaction still arriving are queued
// between two wake-ups of a waiting Next.
const wakeEvery = 128

// waitForRoom blocks while the queue is full, still sending status
// updates so the server keeps the connection.
func (r *reader) waitForRoom(ctx context.Context, st *statusSender) error {
	s := r.s
	for {
		s.mu.Lock()
		full := s.fullLocked()
		var err error
		if full {
			err = s.waitLockedFor(ctx, s.cfg.StatusInterval)
		}
		s.mu.Unlock()
		if !full || err != nil {
			return err
		}
		if err := st.send(ctx, s, false); err != nil {
			return err
		}
	}
}

// statusSender sends standby status updates: when the flush position
// moved, when the interval passed, or when the server asked.
type statusSender struct {
	conn     *pgconn.PgConn
	interval time.Duration
	sent     pglogrepl.LSN
	next     time.Time
}

func (st *statusSender) send(ctx context.Context, s *Source, force bool) error {
	s.mu.Lock()
	flush := s.flush
	s.mu.Unlock()
	now := time.Now()
	if !force && flush == st.sent && now.Before(st.next) {
		return nil
	}
	// Only the flush position matters for a logical slot; write and
	// apply are reported equal to it so nothing suggests more.
	err := pglogrepl.SendStandbyStatusUpdate(ctx, st.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: flush,
		WALFlushPosition: flush,
		WALApplyPosition: flush,
		ClientTime:       now,
	})
	if err != nil {
		return fmt.Errorf("cdc: sending a standby status update: %w", err)
	}
	st.sent, st.next = flush, now.Add(st.interval)
	return nil
}

// connectReplication opens a logical replication connection. A deadline,
// not a cancel request, ends waits on it: a cancel request would abort the
// walsender's stream.
func (s *Source) connectReplication(ctx context.Context) (*pgconn.PgConn, error) {
	cfg, err := pgconfig.ParseConfig(s.cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	pc := cfg.Config.Copy()
	pc.RuntimeParams["replication"] = "database"
	// Text-format values are parsed as ISO dates and hex bytea.
	pc.RuntimeParams["DateStyle"] = "ISO, MDY"
	pc.RuntimeParams["bytea_output"] = "hex"
	if pc.RuntimeParams["application_name"] == "" {
		pc.RuntimeParams["application_name"] = "relay-cdc"
	}
	if pc.ConnectTimeout == 0 {
		pc.ConnectTimeout = 10 * time.Second
	}
	// pgconn reads the socket 8 KiB at a time: a read syscall per ~25
	// messages of a busy stream. A larger buffer in front of it reads
	// whatever the socket holds at once.
	pc.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend {
		return pgproto3.NewFrontend(bufio.NewReaderSize(r, replicationReadBuffer), w)
	}
	pc.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	conn, err := pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		return nil, &scrubbedError{
			msg: fmt.Sprintf("cdc: opening a replication connection to %s: %s", pgconfig.Describe(pc), pgconfig.Scrub(err, s.cfg.DatabaseURL)),
			err: err,
		}
	}
	return conn, nil
}

// replicationReadBuffer is the read buffer of the replication connection.
const replicationReadBuffer = 256 << 10

// scrubbedError keeps the cause of a connection failure for errors.Is
// while its message holds no password.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// housekeep writes heartbeats and marks finished table reads done.
func (s *Source) housekeep(ctx context.Context, pool *pgxpool.Pool, markerDone <-chan pglogrepl.LSN) {
	t := time.NewTicker(s.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case lsn := <-markerDone:
			if _, err := pool.Exec(ctx, "UPDATE "+s.slotsTbl+" SET snapshot = NULL WHERE slot_name = $1 AND consistent_lsn = $2::text::pg_lsn",
				s.slotName(), lsn.String()); err != nil && ctx.Err() == nil {
				s.log.Warn("marking the table read done failed; the next start checks the table again", "err", err)
			}
		case <-t.C:
			if _, err := pool.Exec(ctx, "SELECT pg_logical_emit_message(false, 'relay-heartbeat', '')"); err != nil && ctx.Err() == nil {
				s.log.Warn("writing the heartbeat failed", "err", err)
			}
		}
	}
}
