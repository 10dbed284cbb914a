package cdc

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
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

	// streams are the streamed transactions not yet committed or aborted
	// in this session (streamtx.go), by top-level xid; cur is the one
	// whose chunk is arriving (between Stream Start and Stream Stop).
	streams map[uint32]*streamTx
	cur     *streamTx
	// streamMem is the memory the events in streams take.
	streamMem int64
	spillDir  string
	// noStream is set after a spill file failed: the reader reconnects
	// with protocol version 1, which needs no disk of its own.
	noStream bool
	loggedV1 bool
	// pace reads the current session's connection.
	pace *pacer
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
		var spill *spillError
		switch {
		case errors.As(err, &spill):
			r.noStream = true
			s.spillFailures.Add(1)
			backoff = 0
			s.log.Error("a streamed transaction could not be spilled to disk; reconnecting with pgoutput protocol version 1, which leaves large transactions to the server until they commit, for as long as this source runs",
				"err", err, "spill_dir", r.spillDir)
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
	st, err := s.readSlot(ctx, pool, s.slotName())
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
	r.pace = &pacer{}
	conn, err := s.connectReplication(ctx, r.pace)
	if err != nil {
		return err
	}
	defer func() {
		pid := int32(conn.PID())
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		conn.Close(closeCtx)
		if ctx.Err() != nil {
			s.awaitRelease(closeCtx, pool, s.slotName(), pid)
		}
	}()
	s.mu.Lock()
	s.flush = max(s.flush, st.confirmed)
	s.mu.Unlock()
	version := conn.ParameterStatus("server_version")
	streaming := !s.cfg.NoStreaming && !r.noStream && serverMajor(version) >= 14
	args := []string{
		"proto_version '1'",
		"publication_names '" + s.cfg.PublicationName + "'",
		"messages 'true'",
	}
	if streaming {
		args[0] = "proto_version '2'"
		args = append(args, "streaming 'on'")
	} else if !s.cfg.NoStreaming && !r.noStream && !r.loggedV1 {
		r.loggedV1 = true
		s.log.Warn("the server cannot stream transactions in progress (PostgreSQL 14 and later can): reading pgoutput protocol version 1, so the server holds each transaction until it commits",
			"server_version", version)
	}
	if !s.textTuples && binaryTuples(version) {
		args = append(args, "binary 'true'")
	}
	if r.spillDir == "" {
		id, err := pglogrepl.IdentifySystem(ctx, conn)
		if err != nil {
			return fmt.Errorf("cdc: identifying the server: %w", err)
		}
		r.spillDir = filepath.Join(os.TempDir(), "relay-cdc-spill-"+id.SystemID+"-"+s.slotName())
	}
	err = pglogrepl.StartReplication(ctx, conn, s.slotName(), 0, pglogrepl.StartReplicationOptions{
		Mode:       pglogrepl.LogicalReplication,
		PluginArgs: args,
	})
	if err != nil {
		if st, serr := s.readSlot(ctx, pool, s.slotName()); serr == nil && (!st.exists || st.lost()) {
			return errSlotLost
		}
		return fmt.Errorf("cdc: starting replication from slot %q: %w", s.slotName(), err)
	}
	*backoff = 0
	r.rels = map[uint32]*relation{}
	// The slot is this process's now: spill files in the directory are
	// an earlier session's or process's, whose transactions the server
	// sends again.
	defer func() {
		r.dropStreams()
		if s.cfg.SpillDir == "" {
			// The default directory goes when empty (a process killed
			// leaves it, and its files, to the next one).
			os.Remove(r.spillDir)
		}
	}()
	if n, err := removeSpills(r.spillDir); err != nil {
		s.log.Warn("removing earlier spill files failed", "err", err, "spill_dir", r.spillDir)
	} else if n > 0 {
		s.log.Info("removed spill files of an earlier run; the server sends their transactions again", "files", n, "spill_dir", r.spillDir)
	}
	s.log.Info("streaming from the replication slot", "after", r.skipBelow.String(), "streaming", streaming)
	return r.stream(ctx, conn)
}

// binaryTuples reports whether pgoutput can send values in binary format
// (PostgreSQL 14 and later): the walsender then skips the output functions
// (hex for bytea, date formatting for timestamps) of every type that has a
// send function, and sends bytea at half the size. Types without one still
// come as text, which the decoder reads too. serverVersion is the
// server_version the connection reported, say "15.18 (Debian ...)".
func binaryTuples(serverVersion string) bool { return serverMajor(serverVersion) >= 14 }

// serverMajor is the major version in a server_version, 0 when it has
// none.
func serverMajor(serverVersion string) int {
	end := 0
	for end < len(serverVersion) && isDigit(serverVersion[end]) {
		end++
	}
	major, err := strconv.Atoi(serverVersion[:end])
	if err != nil {
		return 0
	}
	return major
}

// awaitRelease waits until the walsender pid no longer holds the slot, so
// that a Start right after Close finds it free.
func (s *Source) awaitRelease(ctx context.Context, pool *pgxpool.Pool, slot string, pid int32) {
	for {
		st, err := s.readSlot(ctx, pool, slot)
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
				if err := r.handle(ctx, st, xld.WALData); err != nil {
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
func (r *reader) handle(ctx context.Context, st *statusSender, data []byte) error {
	s := r.s
	if r.cur != nil {
		return r.streamed(data)
	}
	if relID, ok := insertRelationID(data); ok {
		return r.insert(relID, data)
	}
	if len(data) == 0 {
		return &permanentError{errors.New("cdc: an empty pgoutput message")}
	}
	switch pglogrepl.MessageType(data[0]) {
	case pglogrepl.MessageTypeStreamStart, pglogrepl.MessageTypeStreamCommit, pglogrepl.MessageTypeStreamAbort:
		return r.streamControl(ctx, st, data)
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
		r.begin(m.FinalLSN, m.CommitTime)
	case *pglogrepl.CommitMessage:
		r.commit(m.TransactionEndLSN)
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

// begin starts a transaction whose commit record is at commitLSN.
func (r *reader) begin(commitLSN pglogrepl.LSN, committed time.Time) {
	r.txMajor, r.txIndex, r.txCommitted = uint64(commitLSN), 0, committed
	s := r.s
	s.mu.Lock()
	s.inTx = true
	s.mu.Unlock()
}

// commit ends the transaction begun, whose end LSN is end.
func (r *reader) commit(end pglogrepl.LSN) {
	r.pace.setBulk(false)
	s := r.s
	s.mu.Lock()
	if s.open != nil && s.open.major == r.txMajor {
		s.closeOpenLocked()
	}
	if r.txMajor > r.lastMajor {
		s.txs = append(s.txs, txMark{major: r.txMajor, last: r.txIndex - 1, empty: r.txIndex == 0, end: end})
		r.lastMajor = r.txMajor
	}
	s.inTx = false
	s.advanceLocked()
	s.notifyLocked()
	s.mu.Unlock()
}

// streamControl applies Stream Start, Stream Commit and Stream Abort,
// which arrive outside chunks.
func (r *reader) streamControl(ctx context.Context, st *statusSender, data []byte) error {
	msg, err := pglogrepl.ParseV2(data, false)
	if err != nil {
		return &permanentError{fmt.Errorf("cdc: decoding a pgoutput message: %w", err)}
	}
	switch m := msg.(type) {
	case *pglogrepl.StreamStartMessageV2:
		tx := r.streams[m.Xid]
		if tx != nil && m.FirstSegment == 1 {
			// The server starts the transaction over.
			r.dropStream(tx)
			tx = nil
		}
		if tx == nil {
			tx = &streamTx{xid: m.Xid, rels: map[uint32]*relation{}}
			r.streams[m.Xid] = tx
			r.s.mu.Lock()
			r.s.streamsOpen++
			r.s.mu.Unlock()
		}
		r.cur = tx
		r.pace.setBulk(true)
	case *pglogrepl.StreamAbortMessageV2:
		tx := r.streams[m.Xid]
		if tx == nil {
			return nil
		}
		if m.SubXid == m.Xid {
			r.dropStream(tx)
			return nil
		}
		freed, err := tx.abortSub(m.SubXid)
		r.streamMem -= freed
		return err
	case *pglogrepl.StreamCommitMessageV2:
		return r.streamCommit(ctx, st, m)
	}
	return nil
}

// streamed applies a message of a chunk: every one but Stream Stop
// carries the xid of the (sub)transaction whose change it is after its
// type byte.
func (r *reader) streamed(data []byte) error {
	tx := r.cur
	if data[0] == byte(pglogrepl.MessageTypeStreamStop) {
		r.cur = nil
		r.pace.setBulk(false)
		return nil
	}
	if len(data) < 5 {
		return &permanentError{fmt.Errorf("cdc: a streamed pgoutput message of %d bytes", len(data))}
	}
	tx.seen(binary.BigEndian.Uint32(data[1:5]))
	switch pglogrepl.MessageType(data[0]) {
	case pglogrepl.MessageTypeInsert:
		// Without the xid the message is a protocol 1 insert: the byte
		// before the relation id becomes the type byte.
		data[4] = data[0]
		relID, ok := insertRelationID(data[4:])
		if !ok {
			return &permanentError{errors.New("cdc: malformed streamed insert")}
		}
		rel := tx.rels[relID]
		if rel == nil {
			rel = r.rels[relID]
		}
		if rel == nil {
			return &permanentError{fmt.Errorf("cdc: insert into relation %d before its relation message", relID)}
		}
		if !rel.outbox {
			return nil
		}
		e, err := r.decode.insert(rel, data[4:])
		if err != nil {
			return &permanentError{err}
		}
		return r.keep(tx, e)
	case pglogrepl.MessageTypeRelation:
		msg, err := pglogrepl.ParseV2(data, true)
		if err != nil {
			return &permanentError{fmt.Errorf("cdc: decoding a pgoutput message: %w", err)}
		}
		m := msg.(*pglogrepl.RelationMessageV2)
		rel, err := newRelation(&m.RelationMessage, r.s.cfg.Schema)
		if err != nil {
			return &permanentError{err}
		}
		tx.rels[m.RelationID] = rel
	case pglogrepl.MessageTypeMessage:
		msg, err := pglogrepl.ParseV2(data, true)
		if err != nil {
			return &permanentError{fmt.Errorf("cdc: decoding a pgoutput message: %w", err)}
		}
		m := msg.(*pglogrepl.LogicalDecodingMessageV2)
		if m.Transactional && m.Prefix == r.prefix {
			return r.keep(tx, messageEvent(&m.LogicalDecodingMessage))
		}
	}
	return nil
}

// keep adds e to tx, spilling the largest open transactions while their
// events take more than the memory bound.
func (r *reader) keep(tx *streamTx, e relay.Event) error {
	r.streamMem += tx.add(e)
	bound := int64(r.s.cfg.StreamMemoryBytes)
	for r.streamMem > bound {
		var largest *streamTx
		for _, t := range r.streams {
			if largest == nil || t.memBytes > largest.memBytes {
				largest = t
			}
		}
		freed, err := largest.spill(r.spillDir)
		if err != nil {
			return err
		}
		r.streamMem -= freed
	}
	return nil
}

// streamCommit queues the events of a committed streamed transaction at
// their positions, as its BEGIN ... COMMIT would have, waiting for room
// in the queue on the way.
func (r *reader) streamCommit(ctx context.Context, st *statusSender, m *pglogrepl.StreamCommitMessageV2) error {
	tx := r.streams[m.Xid]
	if tx == nil {
		// Nothing of it was streamed in this session: it had no changes
		// the publication sends.
		tx = &streamTx{xid: m.Xid}
	}
	r.begin(m.CommitLSN, m.CommitTime)
	n := 0
	err := tx.each(func(e relay.Event) error {
		if n++; n%1024 == 0 {
			if err := st.send(ctx, r.s, false); err != nil {
				return err
			}
		}
		if err := r.waitForRoom(ctx, st); err != nil {
			return err
		}
		r.queueNext(e)
		return nil
	})
	if err != nil {
		return err
	}
	// pgoutput counts the relation messages of a committed streamed
	// transaction as sent to everything after it.
	for id, rel := range tx.rels {
		r.rels[id] = rel
	}
	if r.streams[m.Xid] != nil {
		r.dropStream(tx)
	}
	r.commit(m.TransactionEndLSN)
	return nil
}

// queueNext queues an event at the next position of the current
// transaction, if not delivered yet: an event of a committed streamed
// transaction, or a logical message.
func (r *reader) queueNext(e relay.Event) {
	if pos, ok := r.nextPosition(); ok {
		r.queueAt(e, pos)
	}
}

// nextPosition takes the next position of the current transaction and
// reports whether an event there is still to deliver (it is past what the
// core already has).
func (r *reader) nextPosition() (relay.Position, bool) {
	pos := relay.Position{Major: r.txMajor, Minor: r.txIndex}
	r.txIndex++
	if r.txIndex == bulkAfter {
		r.pace.setBulk(true)
	}
	return pos, r.skipBelow.Less(pos)
}

// queueAt queues e at pos, the position nextPosition gave it. An event
// without a row of its own is dated by the commit.
func (r *reader) queueAt(e relay.Event, pos relay.Position) {
	if e.CreatedAt.IsZero() && !e.HasRow() {
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

// dropStream forgets a streamed transaction and removes its spill file.
func (r *reader) dropStream(tx *streamTx) {
	r.streamMem -= tx.memBytes
	tx.close()
	delete(r.streams, tx.xid)
	if r.cur == tx {
		r.cur = nil
	}
	s := r.s
	s.mu.Lock()
	s.streamsOpen--
	s.advanceLocked()
	s.mu.Unlock()
}

// dropStreams forgets every streamed transaction of the session: the
// next session receives them again.
func (r *reader) dropStreams() {
	for _, tx := range r.streams {
		r.dropStream(tx)
	}
	r.streams, r.cur, r.streamMem = map[uint32]*streamTx{}, nil, 0
}

// message queues the event of an emit_message message (message.go), if
// not delivered yet. It takes the next position of its transaction, as an
// insert does, so messages and inserts keep their order.
func (r *reader) message(m *pglogrepl.LogicalDecodingMessage) {
	r.queueNext(messageEvent(m))
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
	pos, ok := r.nextPosition()
	if !ok {
		return nil
	}
	e, err := r.decode.insert(rel, data)
	if err != nil {
		return &permanentError{err}
	}
	r.queueAt(e, pos)
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
//
// With p set, the connection reads the socket through it (the stream's
// session); without, directly (slot creation).
func (s *Source) connectReplication(ctx context.Context, p *pacer) (*pgconn.PgConn, error) {
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
		if p != nil {
			p.r = r
			r = p
		}
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

// A transaction's events are delivered at its commit, so while the reader
// is inside a large one (bulkAfter events received, or a streamed chunk)
// it need not read each message as it arrives: the walsender sends every
// pgoutput message with its own send, and a reader faster than the
// walsender otherwise wakes, reads a few hundred bytes and sleeps again
// for each few messages, a read syscall, an epoll wait and a scheduler
// round trip each (about a third of the relay's CPU in a backlog drain).
// Instead, after a read of less than pauseBelow, the next read waits
// bulkPause first, and gets what the walsender sent meanwhile at once.
// The commit of such a transaction reaches the reader at most about
// bulkPause later; transactions of fewer events, and everything between
// transactions, are read as before.
const (
	bulkAfter  = 64
	bulkPause  = 500 * time.Microsecond
	pauseBelow = 64 << 10
)

// pacer is the replication connection's reader (see bulkAfter). bulk is
// set by the stream's goroutine; Read runs on it too (pgconn's frontend
// reads only in ReceiveMessage), short is Read's own.
type pacer struct {
	r     io.Reader
	bulk  atomic.Bool
	short bool
}

// setBulk says whether the stream is inside a large transaction; a reader
// without a session (in tests) has no pacer.
func (p *pacer) setBulk(on bool) {
	if p != nil {
		p.bulk.Store(on)
	}
}

func (p *pacer) Read(b []byte) (int, error) {
	if p.short && p.bulk.Load() {
		time.Sleep(bulkPause)
	}
	n, err := p.r.Read(b)
	p.short = n < pauseBelow
	return n, err
}

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
			if err := s.q.MarkTableRead(ctx, pool, s.slotName(), lsn.String()); err != nil && ctx.Err() == nil {
				s.log.Warn("marking the table read done failed; the next start checks the table again", "err", err)
			}
		case <-t.C:
			if err := s.q.Heartbeat(ctx, pool); err != nil && ctx.Err() == nil {
				s.log.Warn("writing the heartbeat failed", "err", err)
			}
		}
	}
}
